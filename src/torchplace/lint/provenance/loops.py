"""Loop classification: which loops step through batches (``"batch"``), which walk a device
value element by element (``"rows"``/``"items"``), and which run once per epoch (their batch
evidence is all inside a nested loop).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import TYPE_CHECKING

from torchplace.lint.base import bindings, call_name
from torchplace.lint.nodes import (
    children,
    isinstance_test,
    own_nodes,
    store_targets,
    subtree,
    walk,
)
from torchplace.lint.provenance.values import (
    _COMPS,
    _FUNCTIONS,
    _LOOPS,
    _SCOPES,
    Fact,
    LoopKind,
    _device_helper,
    _device_target,
    _is_cpu,
    _is_move_call,
    _names,
    _passes_device,
    _short,
    _target_names,
    closure_step,
    moved_in_place,
    moves_to_device,
)
from torchplace.lint.resolver import dotted_name

if TYPE_CHECKING:
    from torchplace.lint.provenance.files import FileFacts

__all__ = [
    "below_restarted_mark",
    "branch_trains",
    "calls_backward",
    "classify",
    "feeds_back",
    "guard_test",
    "has_own_batch_loop",
    "indexed_row",
    "moves_some",
    "rare_test",
    "remainder_nonzero",
    "restarts_mark",
    "step_parts",
    "steps_optimizer",
]

# Iterating these yields parameters, buffers or state: a conversion pass, not batches (an
# optimizer's `for p in group["params"]:` updates one parameter per turn; the key as written,
# not any name holding "params", such as `loader(hparams)`).
_STATE_ITERS = (
    "state_dict",
    "parameters",
    '["params"]',
    "['params']",
    "param_groups",
    "buffers",
    "named_",
    "modules",
    "children",
)
# Words that name a state dict or a checkpoint (`full_sd`, `ckpt`, `checkpoint["model"]`).
_STATE_WORDS = frozenset({"sd", "ckpt", "checkpoint"})


def _names_state(node: ast.expr) -> bool:
    """``node`` iterates a state dict or checkpoint named by one of its words."""
    return any(
        word in _STATE_WORDS
        for sub in walk(node)
        if isinstance(sub, (ast.Name, ast.Attribute))
        for word in (sub.id if isinstance(sub, ast.Name) else sub.attr).lower().split("_")
    )


def _walks_state(facts: FileFacts, it: ast.expr, scope: ast.AST, bound: bool = False) -> bool:
    """``it`` yields parameters, buffers or the entries of a state dict: by what it calls or
    names, or through the one value its name is bound to in ``scope`` (``model_dict =
    net.state_dict().copy()``, then ``model_dict.items()``; ``grads = torch.autograd.grad(loss,
    list(net.parameters()))``: one gradient per parameter)."""
    if any(word in facts.segment(it) for word in _STATE_ITERS) or _names_state(it):
        return True
    root = _unwrapped(it)
    while (
        isinstance(root, ast.Call)
        and isinstance(root.func, ast.Attribute)
        and root.func.attr in {"items", "keys", "values"}
        and not root.args
    ):
        root = root.func.value
    if bound or not isinstance(root, ast.Name):
        return False
    value = _bound_before(scope, root)
    return value is not None and _walks_state(facts, value, scope, True)


def _bound_before(scope: ast.AST, name: ast.Name) -> ast.expr | None:
    """The value of the last plain ``name = value`` of ``scope`` above ``name``'s line (what
    ``name`` holds there; a store by key, ``d[k] = v``, replaces an entry and keeps it), or
    None where another kind of binding (a loop's target, an unpacking) may also set it."""
    plain: dict[int, ast.Assign | ast.AnnAssign] = {}
    stores: list[ast.Name] = []
    for sub in own_nodes(scope):
        if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
            for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                if isinstance(target, ast.Name) and target.id == name.id:
                    plain[id(target)] = sub
        elif isinstance(sub, ast.Name) and sub.id == name.id and isinstance(sub.ctx, ast.Store):
            stores.append(sub)
    if any(id(store) not in plain for store in stores):
        return None  # `for name in ...`, `name, x = ...`: not one plain value
    above = [stmt for stmt in plain.values() if stmt.lineno < name.lineno]
    last = max(above, key=lambda stmt: stmt.lineno, default=None)
    return last.value if last is not None else None


def _asks_the_user(nodes: list[ast.AST]) -> bool:
    """The step reads a line a person types (Python's own ``input()``): an interactive loop,
    one step per answer, not a batch loop."""
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "input"
        for node in nodes
    )


def single_pass(iterable: ast.expr) -> bool:
    """``range(1)`` (or ``range(0, 1)``): a loop that runs its body once."""
    if not (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id == "range"
        and 1 <= len(iterable.args) <= 2
        and all(isinstance(a, ast.Constant) and type(a.value) is int for a in iterable.args)
    ):
        return False
    bounds = [a.value for a in iterable.args]  # type: ignore[attr-defined]
    start, stop = (0, bounds[0]) if len(bounds) == 1 else bounds
    return bool(stop - start <= 1)


def _breaks_first(loop: ast.For | ast.AsyncFor | ast.While) -> bool:
    """The loop's body ends in a ``break`` that nothing skips (no ``continue`` before it): it
    runs once (PARE's batch-gradient check on the first output only)."""
    return (
        bool(loop.body)
        and isinstance(loop.body[-1], ast.Break)
        and not any(isinstance(sub, ast.Continue) for stmt in loop.body for sub in walk(stmt))
    )


def classify(facts: FileFacts, loop: ast.AST, scope: ast.AST) -> tuple[LoopKind, str] | None:
    """``("batch"|"rows"|"items", evidence)`` for a loop or comprehension of ``scope``, or None
    (once per epoch, or nothing says it touches a device)."""
    parts = _parts(loop)
    if parts is None:
        return None
    iters, body, targets = parts
    if isinstance(loop, (ast.For, ast.AsyncFor)) and single_pass(loop.iter):
        return None  # `for _ in range(1):` runs its body once
    if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and _breaks_first(loop):
        return None  # `for key, out in output.items(): ...; break`: the first item only
    if any(_walks_state(facts, it, scope) for it in iters):
        return None  # a pass over parameters or a state dict: conversion, not batches
    if any(_walks_layers(facts, it) for it in iters):
        return None  # `for layer in model.layers: x = layer(x)`: one forward pass
    if _stores_entries(loop):
        return None  # `for k, v in metrics.items(): out[f"x_{k}"] = v.item()`: a conversion
    few = bool(iters) and all(_few_constants(it, scope) for it in iters)
    # `for key in ("a", "b"):` steps a few times per run, not per row: only a step of work in
    # its body (`.backward()`, a moved batch, a model run) makes it a batch loop
    handed = any(_walks_handed(facts, it, scope) for it in iters)
    own, nested = _split_own(body)
    if not _steps_itself(own) and (_capped(loop) or _builds_optimizer(facts, own)):
        return None  # a few steps per run, or a whole training run set up per step
    if _asks_the_user(own):
        return None  # `while True: s = input("Another string: ")`: paced by a person typing
    if not _steps_itself(own) and any(_walks_ranks(it) for it in iters):
        return None  # `for rank in range(world_size):` one rank's turn in a collective
    streamed = any(_streams(it) for it in iters)
    found = None if few or handed or streamed else _iterates_device(facts, iters, scope)
    if found is not None and found[0] == "items" and _gathers_host_values(facts, iters, scope):
        return None  # `dist.all_gather(sizes, local_size)` of a packed `.numel()`: sizes
    if (
        found is not None
        and found[0] == "items"
        and isinstance(loop, (ast.For, ast.AsyncFor))
        and _walks_gathered(facts, iters, scope)
        and not _copies_whole(own)
    ):
        return None  # `dist.gather(x, gather_list=parts)`, then `for t in parts:`: the ranks
    if found is not None and found[0] == "items" and _unpickles_gathered(facts, loop, iters, scope):
        return None  # each rank's pickled bytes from `dist.all_gather`, decoded one by one
    if (
        found is not None
        and found[0] == "rows"
        and all(_returns_dict(facts, i, scope) for i in iters)
    ):
        found = None  # `for key in coeffs:` of `coeffs = split_coeff(x)`: a dict's keys, not rows
    if found is not None and found[0] == "rows" and _rewrites_entries(loop):
        found = None  # `for k in videos: videos[k] = videos[k].cpu()`: a mapping's keys
    if found is not None and found[0] == "rows" and narrowed_to_list(loop, scope):
        # `if isinstance(out, list): out = [o.cpu() for o in out]`: one whole tensor per head
        return "items", found[1]
    if found is not None:
        return found
    if isinstance(loop, ast.While):
        targets = {
            name
            for node in own
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for name in _target_names(t)
        }
    derived = _derived(own, targets)
    fresh = _fresh_models(facts, own)
    nested_batch_lines = [
        getattr(sub, "lineno", 0) for sub in nested if facts.loop_kind(sub, scope) is not None
    ]
    nested_batch = bool(nested_batch_lines)
    offloaded = _offloaded(facts, own) | _collective_uploads(facts, own)
    step = None
    for node in own:
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "backward":
            return "batch", "it calls `.backward()` on every step"
        if _wrapped_step(node):
            what = _short(facts.segment(node), 40)
            return "batch", f"it calls `{what}`, which backpropagates the loss, on every step"
        if (
            isinstance(func, ast.Attribute)
            and name in {"step", "zero_grad"}
            and (not node.args or closure_step(node, facts.defs))
            and "sched" not in facts.segment(func.value).lower()
            and not (name == "step" and _bound_to_scheduler(facts, func.value, scope))
            and not (name == "zero_grad" and _resets_epoch(node, own, nested_batch_lines))
        ):
            what = facts.segment(node) if node.args else f"{facts.segment(func)}()"
            return "batch", f"it calls `{_short(what, 40)}` on every step"
        if derived and (
            (
                _is_move_call(node)
                and moves_to_device(node, facts.qualname)
                and not _is_cpu(_device_target(node))
            )
            or (name is not None and _device_helper(name, node.args))
            or (
                name is not None
                and not _is_move_call(node)
                and not (facts.qualname(func) or "").startswith("torch.")
                and _passes_device(node)
            )
        ):
            moved: ast.expr | None = None
            if isinstance(func, ast.Attribute) and _is_move_call(node):
                moved = func.value
            elif node.args:
                moved = node.args[0]
            if (
                moved is not None
                and _names(moved) & derived
                and not (_model_root(facts, moved) or _names(moved) & fresh)
                and not _rewrites_by_index(loop)
                and id(node) not in offloaded
            ):
                what = _short(facts.segment(moved), 24)
                its = "what it iterates" if iters else "what it reads"
                return "batch", f"it moves {its} to a device (`{what}`, line {node.lineno})"
        if derived and _moves_handed(facts, node, derived, scope):
            what = _short(facts.segment(func), 32)
            return "batch", f"it hands what it iterates to `{what}`, which moves it to a device"
        if step is None and not nested_batch and name is not None and not _given(node, fresh):
            step = _step_call(facts, node, scope) or _fetches_batch(facts, node, name, scope)
    if (
        step is None
        and not nested_batch
        and (iters or isinstance(loop, ast.While))
        and not few
        and not handed
        and not _rewrites_entries(loop)
        and not _rewrites_by_index(loop)
        and not _converts_by_key(loop)
    ):
        step = _updates_device(facts, own, loop, scope)
    return step


# A literal collection this small steps a few times per run, not once per batch.
_FEW = 16
# Methods that grow a list, set or dict in place.
_GROWS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "__setitem__"})


def _steps_itself(own: list[ast.AST]) -> bool:
    """A loop step's own nodes call ``.backward()`` or a ``.step()``: it trains per step."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"backward", "step"}
        for node in own
    )


def _builds_optimizer(facts: FileFacts, own: list[ast.AST]) -> bool:
    """A loop step that builds an optimizer (``optimizer = optim.Adam(model.parameters())``)
    sets up a training run that nested loops or called functions carry out (benchmarking-gnns'
    ``for split_num in range(len(train_masks)):``): once per split, seed or configuration,
    not once per batch."""
    for node in own:
        if isinstance(node, ast.Call):
            module, _, name = (facts.qualname(node.func) or "").rpartition(".")
            if module == "torch.optim" and name[:1].isupper():
                return True
    return False


def _walks_layers(facts: FileFacts, it: ast.expr) -> bool:
    """``it`` is a model's container of layers (``model.layers``, ``enumerate(self.blocks)``,
    ``encoder.encoder_layers``, by the name's end, or an attribute the file sets to an
    ``nn.Sequential``/``nn.ModuleList``/``nn.ModuleDict``), or a walk over its submodules
    (``model.modules()``)."""
    it = _unwrapped(it)
    if _submodules(it):
        return True
    return isinstance(it, ast.Attribute) and it.attr in facts.layer_lists


def _model_root(facts: FileFacts, node: ast.expr) -> bool:
    """``node`` is a model built right there, perhaps placed or set up by a method chain
    (``BaseNetwork(act_fn=fn).to(device)``, ``nn.Linear(4, n).cuda().eval()``)."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and not facts.builds_module(node)
    ):
        node = node.func.value
    return facts.builds_module(node)


def _fresh_models(facts: FileFacts, own: list[ast.AST]) -> set[str]:
    """The names a loop's step binds to a model it builds: a loop that builds a model each
    step (``net = BaseNetwork(act_fn=fn).to(device)``, then ``visualize_gradients(net)``)
    runs once per configuration, not per batch, whatever it then does with the model."""
    return {
        target.id
        for node in own
        if isinstance(node, ast.Assign) and _model_root(facts, node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _given(call: ast.Call, names: set[str]) -> bool:
    """``call`` is handed one of ``names`` as an argument."""
    return any(
        isinstance(arg, ast.Name) and arg.id in names
        for arg in [*call.args, *(kw.value for kw in call.keywords)]
    )


def _constant_item(node: ast.expr) -> bool:
    """``"local"``, or a tuple of constants, ``("local", 3, 6)``: one settings row."""
    if isinstance(node, ast.Tuple):
        return all(isinstance(e, ast.Constant) for e in node.elts)
    return isinstance(node, ast.Constant)


def _few_constants(it: ast.expr, scope: ast.AST, bound: bool = False) -> bool:
    """``("a", "b")``, ``{"loss": l, "acc": a}`` (its keys), ``enumerate([...])``, ``d.items()``
    of such a dict, or a name bound once in ``scope`` to one and never grown: a loop over it
    runs a few times, with constants (or the few values named beside them)."""
    if isinstance(it, ast.Call):
        func = it.func
        if isinstance(func, ast.Name) and func.id in {"enumerate", "reversed"} and it.args:
            return _few_constants(it.args[0], scope, bound)
        if isinstance(func, ast.Attribute) and func.attr in {"items", "keys", "values"}:
            return not it.args and _few_constants(func.value, scope, bound)
        return False
    if isinstance(it, ast.Dict):
        keys = it.keys
        return 0 < len(keys) <= _FEW and all(isinstance(k, ast.Constant) for k in keys)
    if isinstance(it, (ast.Tuple, ast.List, ast.Set)):
        return 0 < len(it.elts) <= _FEW and all(_constant_item(e) for e in it.elts)
    if not isinstance(it, ast.Name) or bound:
        return False
    values: list[ast.expr] = []
    own_keys = _own_keys(scope, it.id)
    for node in subtree(scope):
        if isinstance(node, ast.Name) and node.id == it.id and not isinstance(node.ctx, ast.Load):
            parent_value = _assigned(scope, node)
            if parent_value is None:
                return False
            values.append(parent_value)
        elif _grows(node, it.id) and not _keyed_by(node, own_keys):
            return False
    return len(values) == 1 and _few_constants(values[0], scope, bound=True)


def _own_keys(scope: ast.AST, name: str) -> set[str]:
    """The names that loops over ``name``'s own keys bind (see :func:`_walked_keys`): a store
    under one of them rewrites an entry, it adds none."""
    return {
        walked[1]
        for node in subtree(scope)
        if isinstance(node, (ast.For, ast.AsyncFor))
        and (walked := _walked_keys(node)) is not None
        and walked[0] == name
    }


def _keyed_by(node: ast.AST, keys: set[str]) -> bool:
    """``d[k] += v`` with ``k`` one of ``keys``."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Name)
        and node.slice.id in keys
    )


def _grows(node: ast.AST, name: str) -> bool:
    """``d[k] = v`` with a computed key, ``names.append(n)``, ``d.update(x)``: ``name`` grows."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and not isinstance(node.ctx, ast.Load)
        and not isinstance(node.slice, ast.Constant)
    ) or (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and node.attr in _GROWS
    )


def _returns_dict(facts: FileFacts, it: ast.expr, scope: ast.AST) -> bool:
    """``coeffs`` bound once, and never grown, to a call of a function of the file whose every
    ``return`` gives a dict display of a few constant keys (``split_coeff(full)`` returning
    ``{"id": c[:, :80], "exp": c[:, 80:144], ...}``): walking it walks its keys."""
    if not isinstance(it, ast.Name) or any(_grows(sub, it.id) for sub in subtree(scope)):
        return False
    value = _bound_before(scope, it)
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return False
    node = facts.top_level(value.func.id)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    values = [r.value for r in own_nodes(node) if isinstance(r, ast.Return)]
    return bool(values) and all(
        isinstance(v, ast.Dict) and _few_constants(v, node, bound=True) for v in values
    )


def _capped(loop: ast.AST) -> bool:
    """A ``for`` loop that leaves after a few steps by its own counter: ``if bib >= 5:
    break`` in its body (StyleTTS2's epoch-end audio samples, six rows of the last batch), or
    after its first step, by a ``break`` that ends its body: whatever its steps move or run,
    it runs a few times per run of what holds it. Also a loop whose step is one ``try`` that
    leaves when it succeeds (see ``_retries``)."""
    if _retries(loop):
        return True
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    if isinstance(loop.body[-1], ast.Break) and not any(
        isinstance(sub, ast.Continue) for stmt in loop.body for sub in _own_flow(stmt)
    ):
        return True  # `for batch in testloader: ...; break`: one batch, for a sample (voicefilter)
    counters = set(_target_names(loop.target))
    for stmt in loop.body:
        if not (isinstance(stmt, ast.If) and isinstance(stmt.body[0], ast.Break)):
            continue
        test = stmt.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.ops[0], (ast.GtE, ast.Gt, ast.Eq))
            and isinstance(test.left, ast.Name)
            and test.left.id in counters
            and isinstance(test.comparators[0], ast.Constant)
            and type(test.comparators[0].value) is int
            and test.comparators[0].value < _FEW
        ):
            return True
    return False


def _retries(loop: ast.AST) -> bool:
    """``while bs: try: preds = run(bs) ... except RuntimeError: bs //= 2 else: break``: a loop
    that ends in a ``try`` whose success leaves it (a ``break`` ending its ``else`` or its
    body), with no ``continue`` outside the handlers: only a failure, an out-of-memory error
    that halves the batch size, runs the step again. One pass of what holds it, retried."""
    if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) or not loop.body:
        return False
    last = loop.body[-1]
    if not isinstance(last, ast.Try) or not last.handlers:
        return False
    success = last.orelse or last.body
    if not isinstance(success[-1], ast.Break):
        return False
    kept = [*loop.body[:-1], *last.body, *last.orelse, *last.finalbody]
    return not any(isinstance(sub, ast.Continue) for stmt in kept for sub in _own_flow(stmt))


def _own_flow(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of ``stmt`` whose ``continue`` or ``break`` acts on the loop that holds it:
    not those of loops or functions nested in it."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        found.append(node)
        if node is stmt or not isinstance(
            node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)
        ):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _assigned(scope: ast.AST, name: ast.Name) -> ast.expr | None:
    """The value of ``name = value`` (a plain assignment of the name alone), or None."""
    for node in subtree(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(t is name for t in targets):
                return node.value
    return None


def _parts(loop: ast.AST) -> tuple[list[ast.expr], list[ast.AST], set[str]] | None:
    """What a loop iterates, its body, and the names it binds per step."""
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        return [loop.iter], list(loop.body), set(_target_names(loop.target))
    if isinstance(loop, ast.While):
        return [], list(loop.body), set()
    if isinstance(loop, _COMPS):
        iters = [g.iter for g in loop.generators]
        body: list[ast.AST] = (
            [loop.elt] if not isinstance(loop, ast.DictComp) else [loop.key, loop.value]
        )
        return iters, body, {n for g in loop.generators for n in _target_names(g.target)}
    return None


def _iterates_device(
    facts: FileFacts, iters: list[ast.expr], scope: ast.AST
) -> tuple[LoopKind, str] | None:
    """A loop over a device value: its rows (a tensor) or its items (a list of tensors); or
    over what a helper built for the device (``create_loader(ds, device=device)``): batches.
    The sequences a ``zip`` walks side by side count each (``for t_cur, t_next in
    zip(t_steps[:-1], t_steps[1:])`` walks the rows of ``t_steps``)."""
    for it in _zip_arguments(iters):
        fact = facts.fact(it, scope)
        if fact is not None and fact.on_device and _loader_for_device(fact, facts.segment(it)):
            what = _short(facts.segment(it), 32)
            return "batch", f"it iterates `{what}`, built for the device ({fact.describe()})"
        if fact is not None and fact.on_device and not fact.many and _names_loader(it):
            what = _short(facts.segment(it), 32)
            return "batch", f"it iterates `{what}`, a loader of device batches ({fact.describe()})"
        if fact is not None and fact.on_device:
            return (
                "items" if fact.many or _walks_mapping(it) or _transposes(it) else "rows",
                f"it iterates `{_short(facts.segment(it), 32)}` on the device: "
                + (fact.describe()),
            )
    return None


def _transposes(it: ast.expr) -> bool:
    """``zip(*meshes)``: the items of the sequences a value holds, side by side (GET3D's
    per-mesh vertices, faces and textures), not the rows of one tensor."""
    inner = _unwrapped(it)
    return (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id == "zip"
        and any(isinstance(a, ast.Starred) for a in inner.args)
    )


_SUBMODULE_LISTS = ("layers", "blocks")
_SUBMODULE_WALKS = frozenset({"modules", "children", "named_modules", "named_children"})


def _submodules(it: ast.expr) -> bool:
    """``encoder.encoder_layers``, ``self.blocks``, ``model.modules()``: a model's submodules,
    one module per step, not the rows of a tensor nor a list of tensors."""
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute):
        return it.func.attr in _SUBMODULE_WALKS
    return isinstance(it, ast.Attribute) and it.attr.lower().endswith(_SUBMODULE_LISTS)


def _zip_arguments(iters: list[ast.expr]) -> list[ast.expr]:
    """``iters``, with a ``zip(a, b)`` (also under ``enumerate``/``tqdm``) taken as what it
    walks side by side; a loader zipped with anything stays a loader (``zip(loader, names)``
    is still checked as the loader it holds)."""
    found: list[ast.expr] = []
    for it in iters:
        inner = _unwrapped(it)
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "zip"
            and inner.args
            and not inner.keywords
            and not any(isinstance(a, ast.Starred) for a in inner.args)
        ):
            found += inner.args
        else:
            found.append(it)
    return found


def _walks_handed(facts: FileFacts, it: ast.expr, scope: ast.AST) -> bool:
    """``for i, x in enumerate(prediction)`` over a parameter the function's callers all hand a
    device value: a tensor's rows or a list of them (``non_max_suppression``'s per-image
    outputs), the callers do not say which, nor how often they call: not a batch loop nor a
    walk over a tensor's rows by that alone."""
    root = _unwrapped(it)
    if not isinstance(root, ast.Name):
        return False
    handed = facts.given(scope).get(root.id)
    return handed is not None and facts.fact(root, scope) == handed


def _streams(it: ast.expr) -> bool:
    """``for token in generate_text_basic_stream(model, ids):`` over a function named for a
    stream (``generate_stream``, ``stream_generate``): its items come one per step of the
    generation (a token as it is decoded), not as the rows of one device tensor. (A generator
    of another name may yield the slices of one batch, ``split_microbatches(n, x, y)``.)"""
    call = _unwrapped(it)
    name = dotted_name(call.func) if isinstance(call, ast.Call) else None
    return name is not None and "stream" in name.rpartition(".")[2].lower().split("_")


def _walks_mapping(iterable: ast.expr) -> bool:
    """``outputs.items()``, ``outputs.values()``: a mapping's values are whole tensors (one
    each), not the rows of one tensor; a tensor has neither method."""
    if (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id == "enumerate"
        and iterable.args
    ):
        return _walks_mapping(iterable.args[0])
    return (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Attribute)
        and iterable.func.attr in {"items", "values"}
        and not iterable.args
    )


def _walked_keys(loop: ast.For | ast.AsyncFor) -> tuple[str, str] | None:
    """``(mapping, key)`` of a loop over a mapping's own keys: ``for k in d:``, ``for k in
    d.keys():``, ``for k, v in d.items():``, also through ``list(...)``, ``sorted(...)`` or
    ``tuple(...)``; None for any other loop."""
    walked, target = loop.iter, loop.target
    if (
        isinstance(walked, ast.Call)
        and isinstance(walked.func, ast.Name)
        and walked.func.id in {"list", "sorted", "tuple"}
        and len(walked.args) == 1
    ):
        walked = walked.args[0]
    if isinstance(walked, ast.Call) and isinstance(walked.func, ast.Attribute) and not walked.args:
        if walked.func.attr == "items" and isinstance(target, ast.Tuple) and target.elts:
            target = target.elts[0]
        elif walked.func.attr != "keys":
            return None
        walked = walked.func.value
    mapping = dotted_name(walked)
    if mapping is None or not isinstance(target, ast.Name):
        return None
    return mapping, target.id


def _rewrites_entries(loop: ast.AST) -> bool:
    """A loop over a mapping's keys (:func:`_walked_keys`) that stores each entry back under
    its key: StyleGAN3's broadcast of every metric, ``for key, value in list(results.items()):
    value = float(value.cpu()); results[key] = value``, CogVideo's ``for k in videos:
    videos[k] = videos[k].float().cpu()`` (a list is not indexed by its own elements): a pass
    over the entries of one mapping, as a loop that moves them in place is, not a loop over
    batches or rows."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    walked = _walked_keys(loop)
    if walked is None:
        return False
    mapping, key = walked
    return any(
        isinstance(target, ast.Subscript)
        and dotted_name(target.value) == mapping
        and isinstance(target.slice, ast.Name)
        and target.slice.id == key
        for part in loop.body
        for stmt in walk(part)
        if isinstance(stmt, ast.Assign)
        for target in stmt.targets
    )


def _rewrites_by_index(loop: ast.AST) -> bool:
    """``for i in range(len(conds)):`` that moves what each entry holds and stores it back,
    ``conds[i] = modified``: a pass that prepares the entries of one list in place (the
    conditions of a sampler, before its loop), as one over a mapping's items is, not a loop
    over batches."""
    if not (isinstance(loop, (ast.For, ast.AsyncFor)) and isinstance(loop.target, ast.Name)):
        return False
    walked = _range_of_len(loop.iter)
    if walked is None:
        return False
    index = loop.target.id
    assigns = [stmt for part in loop.body for stmt in walk(part) if isinstance(stmt, ast.Assign)]
    records = {
        target.id
        for stmt in assigns
        if _entry_record(stmt.value, walked, index)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }
    return any(
        isinstance(target, ast.Subscript)
        and dotted_name(target.value) == walked
        and isinstance(target.slice, ast.Name)
        and target.slice.id == index
        and isinstance(stmt.value, ast.Name)
        and stmt.value.id in records
        for stmt in assigns
        for target in stmt.targets
    )


def _entry_record(value: ast.expr, walked: str, index: str) -> bool:
    """``c = conds[i]``, ``modified = c.copy()``, a dict display: the entry itself, or a
    record of settings built for it (not a tensor a model computed, ``y = model(x)``)."""
    if isinstance(value, ast.Dict):
        return True
    if isinstance(value, ast.Subscript):
        return (
            dotted_name(value.value) == walked
            and isinstance(value.slice, ast.Name)
            and value.slice.id == index
        )
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "copy"
        and not value.args
    )


def _range_of_len(it: ast.expr) -> str | None:
    """``conds`` of ``range(len(conds))``."""
    inner = _sole_argument(it, "range")
    arg = _sole_argument(inner, "len") if inner is not None else None
    return dotted_name(arg) if arg is not None else None


def _sole_argument(node: ast.expr, name: str) -> ast.expr | None:
    """``x`` of ``name(x)``, a call of the plain name with one positional argument."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
        and len(node.args) == 1
    ):
        return node.args[0]
    return None


def _stores_entries(loop: ast.AST) -> bool:
    """``for key, val in metrics.items(): out[f"{name}_{key}"] = val.item()``: a body of
    nothing but stores, each of the step's value under a key built from the step's key, into
    a mapping: one pass that converts the entries of a mapping (a few metrics), not batches.
    Also its comprehension, ``{k: v.detach().cpu().numpy() for k, v in samples.items()}``
    (PDEBench's MCMC samples, one whole tensor per site)."""
    if isinstance(loop, ast.DictComp) and len(loop.generators) == 1:
        generator = loop.generators[0]
        target = generator.target
        return (
            _walks_mapping(generator.iter)
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts)
            and _names(target.elts[0]) <= _names(loop.key)
            and _names(target.elts[1]) <= _names(loop.value)
        )
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Tuple):
        return False
    if not (_walks_mapping(loop.iter) and len(loop.target.elts) == 2):
        return False
    key, value = loop.target.elts
    if not (isinstance(key, ast.Name) and isinstance(value, ast.Name)):
        return False
    return all(
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Subscript)
        and key.id in _names(stmt.targets[0].slice)
        and value.id in _names(stmt.value)
        for stmt in loop.body
    )


def _converts_by_key(loop: ast.AST) -> bool:
    """``for k in x: r[k] = dist_mean(x[k])`` (lingua's ``dist_mean_dict``), ``for i in
    range(len(toks)): toks[i] = toks[i].item()``: a pass that stores each entry of one
    collection, converted, under its own key, as ``_rewrites_entries`` does for ``.items()``:
    one pass over a few metrics, not a loop over batches."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Name):
        return False
    key = loop.target.id
    source = dotted_name(_keyed_collection(loop.iter))
    if source is None:
        return False

    def by_key(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Name)
            and node.slice.id == key
        )

    return any(
        isinstance(stmt, ast.Assign)
        and any(by_key(target) for target in stmt.targets)
        and any(
            isinstance(sub, ast.Subscript) and by_key(sub) and dotted_name(sub.value) == source
            for sub in walk(stmt.value)
        )
        for part in loop.body
        for stmt in walk(part)
    )


def _keyed_collection(iterable: ast.expr) -> ast.expr:
    """The collection whose keys a loop walks: ``x`` of ``x``, ``x.keys()`` or
    ``range(len(x))``."""
    if not isinstance(iterable, ast.Call):
        return iterable
    func, args = iterable.func, iterable.args
    if isinstance(func, ast.Attribute) and func.attr == "keys" and not args:
        return func.value
    inner = args[0] if len(args) == 1 else None
    if (
        isinstance(func, ast.Name)
        and func.id == "range"
        and isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id == "len"
        and len(inner.args) == 1
    ):
        return inner.args[0]
    return iterable


def _loader_for_device(fact: Fact, text: str) -> bool:
    """A loader a call built for the device (``create_loader(ds, device=device)``, also an
    iterator, JoeyNMT's ``self.train_iter = train_data.make_iter(..., device=self.device)``),
    not a tensor the code moved: what it yields are batches, not rows."""
    if fact.many or fact.move is None or not fact.move.startswith("placed by"):
        return False
    words = f"{text} {fact.source}".lower()
    return any(word in words for word in (*_BATCH_WORDS, "iter"))


# Calls that hand back what they wrap, item by item.
_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "iter"})


def _unwrapped(it: ast.expr) -> ast.expr:
    """What a loop steps through under its wrappers: ``loader`` of ``enumerate(tqdm(loader))``."""
    while isinstance(it, ast.Call) and dotted_name(it.func) in _WRAPPERS and it.args:
        it = it.args[0]
    return it


def _names_loader(it: ast.expr) -> bool:
    """``train_dataloader``, ``self.eval_dl``: a name for a data loader, which yields batches.
    A loader that ``accelerator.prepare(model, optimizer, loader)`` hands back with a model
    already on the device shares the model's fact; stepping through it is a batch loop, not a
    walk over the rows of a tensor."""
    name = dotted_name(_unwrapped(it))
    if name is None:
        return False
    last = _without_split(name.rsplit(".", 1)[-1].lower())
    return last.endswith("loader") or last == "dl" or last.endswith("_dl")


def _names_dataset(node: ast.expr) -> bool:
    """``val_dataset``, ``self.test_ds``: a name for a whole dataset."""
    name = dotted_name(node)
    last = _without_split(name.rsplit(".", 1)[-1].lower()) if name is not None else ""
    return last.endswith("dataset") or last == "ds" or last.endswith("_ds")


# Words naming a data split, which DETR-style code puts last (`data_loader_train`,
# `dataset_val`): the name still names a whole loader or dataset.
_SPLITS = frozenset({"train", "val", "valid", "validation", "test", "eval", "dev"})


def _without_split(name: str) -> str:
    """``data_loader_train`` -> ``data_loader``: a trailing split word dropped."""
    head, _, tail = name.rpartition("_")
    return head if head and tail in _SPLITS else name


def _updates_device(
    facts: FileFacts, own: list[ast.AST], loop: ast.AST, scope: ast.AST
) -> tuple[LoopKind, str] | None:
    """The loop recomputes a device value from its items or its own previous value."""
    walked = set(_target_names(loop.target)) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    targets = _offsets(own, walked) | _carried(own) | _grown_back(own)
    per_pass = _from_whole_passes(facts, own, scope, walked)
    for node in own:
        updated = _updated_in_place(facts, node, scope)
        if updated is not None:
            return "batch", updated
        if not isinstance(node, (ast.Assign, ast.AugAssign)):
            continue
        value = node.value
        bound = _bound_names(node)
        if not (_names(value) & (targets | bound)) or isinstance(node, ast.AugAssign):
            continue
        if _fills_rows(node, own):
            continue  # `x[i, n:] = torch.zeros(...)`: a tensor filled in place, nothing carried
        if _uploads_for_collective(facts, value, bound, own):
            continue
        if _runs_whole_pass(facts, value, scope) or _pins(value) or bound <= per_pass:
            continue
        if _model_root(facts, value):
            continue  # `args.model = Net().to(args.device)`: a model built each step, not data
        for part in _computed_parts(value, targets | bound):
            fact = facts.fact(part, scope)
            if fact is not None and fact.on_device and fact.move is not None:
                what = _short(facts.segment(value), 32)
                return "batch", f"it computes `{what}` on the device every step ({fact.describe()})"
    return None


def _offsets(own: list[ast.AST], walked: set[str]) -> set[str]:
    """``walked`` and the names a loop body computes from them by plain arithmetic
    (``start = i * seqlen``, ``end = min(start + bs, n)``): offsets of the same step, which
    slice the step's window out of a tensor (``data[:, start:end]``)."""
    found = set(walked)
    for node in own:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _names(node.value) & found
            and _arithmetic(node.value)
        ):
            found.add(node.targets[0].id)
    return found


def _arithmetic(node: ast.expr) -> bool:
    """``node`` is integer arithmetic of names and numbers (``min``/``max``/``int`` allowed)."""
    if isinstance(node, ast.BinOp):
        return _arithmetic(node.left) and _arithmetic(node.right)
    if isinstance(node, ast.UnaryOp):
        return _arithmetic(node.operand)
    if isinstance(node, ast.Call):
        return (
            isinstance(node.func, ast.Name)
            and node.func.id in {"min", "max", "int"}
            and not node.keywords
            and all(_arithmetic(arg) for arg in node.args)
        )
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    return isinstance(node, (ast.Name, ast.Attribute))


def _fills_rows(node: ast.Assign | ast.AugAssign, own: list[ast.AST]) -> bool:
    """Every target of ``node`` is an item of a name the loop never binds
    (``x_rnn[i, lengths[i]:, :] = torch.zeros(...)``): the loop fills a tensor in place; what
    it computes is not carried from one step to the next."""
    if not isinstance(node, ast.Assign):
        return False
    roots: set[str] = set()
    for target in node.targets:
        root = target
        while isinstance(root, ast.Subscript):
            root = root.value
        if root is target or not isinstance(root, ast.Name):
            return False
        roots.add(root.id)
    return not roots & _plainly_bound(own)


def _plainly_bound(own: list[ast.AST]) -> set[str]:
    """Names the statements ``own`` bind as names (not items of them)."""
    found: set[str] = set()
    for target in (t for node in own for t in store_targets(node)):
        elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        found |= {e.id for e in elts if isinstance(e, ast.Name)}
    return found


def _updated_in_place(facts: FileFacts, node: ast.AST, scope: ast.AST) -> str | None:
    """A statement that updates a device tensor in place, ``input_pos.add_(n)`` (litgpt's
    speculative decoding advancing its device position each step): the loop's own state is
    computed on the device every step. Why, or None."""
    if not (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and isinstance(node.value.func.value, ast.Name)
    ):
        return None
    method = node.value.func.attr
    if not method.endswith("_") or method.startswith("_") or method in _NOT_IN_PLACE:
        return None
    fact = facts.fact(node.value.func.value, scope)
    if fact is None or not fact.moved:
        return None
    what = _short(facts.segment(node.value), 32)
    return f"it updates `{what}` on the device every step ({fact.describe()})"


#: methods whose name ends in ``_`` without being a tensor's in-place update
_NOT_IN_PLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad_"})


def _bound_names(node: ast.Assign | ast.AugAssign) -> set[str]:
    """The names an assignment binds."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n for t in targets for n in _target_names(t)}


def _from_whole_passes(
    facts: FileFacts, own: list[ast.AST], scope: ast.AST, walked: set[str]
) -> set[str]:
    """Names a loop step binds only to what a whole pass hands back, or to values kept only
    from such names and their own previous value: an epoch loop's ``prec1 =
    validate(val_loader, model, criterion)``, then ``is_best = prec1 > best_prec1`` and
    ``best_prec1 = max(prec1, best_prec1)`` keep the best score once per pass, not per batch.
    A name the step also binds to anything else, or the loop to its items, is not one."""
    assigns = [node for node in own if isinstance(node, ast.Assign)]
    step_bound = walked | {n for node in assigns for n in _bound_names(node)}
    passes = [node for node in assigns if _runs_whole_pass(facts, node.value, scope)]

    def qualifies(node: ast.Assign, found: set[str]) -> bool:
        read = _names(node.value) & step_bound
        if node in passes:
            return True
        return bool(read & found) and not read - _bound_names(node) - found and _kept(node.value)

    found = {n for node in passes for n in _bound_names(node)} - walked
    for _ in range(len(assigns)):
        grown = {n for node in assigns if qualifies(node, found) for n in _bound_names(node)}
        rebound = {n for node in assigns if not qualifies(node, grown) for n in _bound_names(node)}
        if grown - rebound - walked == found:
            break
        found = grown - rebound - walked
    return found


# Builtins that keep or compare scores: `best = max(score, best)` computes on no device.
_KEEPERS = frozenset({"max", "min", "abs", "round"})


def _kept(value: ast.expr) -> bool:
    """``max(prec1, best_prec1)``, ``prec1 > best_prec1``: arithmetic, comparisons and a few
    builtins over scores; a model run or a method call is device work of the step."""
    return all(
        isinstance(sub.func, ast.Name) and sub.func.id in _KEEPERS
        for sub in walk(value)
        if isinstance(sub, ast.Call)
    )


def _pins(value: ast.expr) -> bool:
    """``partial = partial.pin_memory()``: only a host tensor can be pinned, so the step
    computes nothing on the device (a pool of pinned staging buffers being filled)."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "pin_memory"
    )


def _computed_parts(value: ast.expr, names: set[str]) -> list[ast.expr]:
    """What of ``value`` a step computes from its items: a dict, list or tuple display only
    through its entries that read them (an epoch loop's checkpoint record, ``{"model":
    model.state_dict(), "epoch": epoch}``, packs the model's state beside the step's number:
    it computes nothing from the items)."""
    if isinstance(value, ast.Dict):
        entries = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.List, ast.Tuple)):
        entries = list(value.elts)
    else:
        return [value]
    return [entry for entry in entries if _names(entry) & names]


def _runs_whole_pass(facts: FileFacts, value: ast.expr, scope: ast.AST) -> bool:
    """``mean_loss, lr = train_one_epoch(model, optimizer, train_loader, device, epoch)``: a
    call handed a data loader or a dataset (by its name; not one batch), or one of the file's functions that walks
    batches itself, runs a whole pass over the data; what it hands back is read once per
    pass, not once per batch."""
    if not isinstance(value, ast.Call):
        return False
    handed = [*value.args, *(k.value for k in value.keywords)]
    if any(_names_loader(arg) or _names_dataset(arg) for arg in handed):
        return True
    callee = facts.local_def(value.func, scope)
    return callee is not None and has_own_batch_loop(callee)


# Constructors that pack host values into a tensor: `torch.IntTensor([x.numel()])`.
_PACKERS = frozenset(
    f"torch.{name}"
    for name in ("tensor", "as_tensor", "IntTensor", "LongTensor", "FloatTensor", "DoubleTensor")
)


# `collections.abc.Sequence` too: no tensor is one (`isinstance(outputs, Sequence)`)
_SEQUENCES = frozenset({"list", "tuple", "Sequence", "MutableSequence"})


def narrowed_to_list(loop: ast.AST, scope: ast.AST) -> bool:
    """The loop walks a name that an enclosing ``if isinstance(out, list):`` (or a conditional
    expression's test, ``[o.cpu() for o in out] if isinstance(out, (list, tuple)) else ...``)
    finds to be a list or tuple: whole tensors (a model's heads), not the rows of one."""
    parts = _parts(loop)
    if parts is None:
        return False
    walked = {root.id for it in parts[0] if isinstance(root := _unwrapped(it), ast.Name)}
    if not walked:
        return False
    for node in walk(scope):
        if isinstance(node, ast.If):
            body: list[ast.AST] = list(node.body)
        elif isinstance(node, ast.IfExp):
            body = [node.body]
        else:
            continue
        if _tests_sequence(node.test, walked) and any(
            sub is loop for part in body for sub in walk(part)
        ):
            return True
    return False


def indexed_row(
    facts: FileFacts,
    loop: ast.AST,
    receiver: ast.expr,
    scope: ast.AST,
    comps: tuple[ast.expr, ...] = (),
) -> str | None:
    """Evidence that ``receiver`` is one row of a device tensor that ``loop`` walks by its
    counter (``for k in range(n): imgs[k].cpu()``, ``[boxes[i].item() for i in
    range(len(boxes))]``): a read back per row, where one copy of the whole tensor would do.
    None for a loop that steps a few times (``range(3)`` over a model's heads, a ``break``
    after its first step or a few), for a tensor not known to be on the device (a host list,
    a host copy), a list of whole tensors, or a parameter the callers hand in (they do not say
    whether it is a tensor or a list of them)."""
    counters = _counters(loop)
    if not counters or _capped(loop):
        return None
    indexed = _indexed_by(receiver, counters)
    if indexed is None:
        return None
    fact = facts.fact(indexed, scope, comps=comps)
    if fact is None or not fact.on_device or fact.many or _walks_handed(facts, indexed, scope):
        return None
    if _under_sequence_test(loop, indexed, scope):
        return None  # `if isinstance(xs[0], list):`, then `xs[i][j].cpu()`: whole tensors
    what = _short(facts.segment(indexed), 32)
    return f"it reads `{what}` row by row, by its counter: {fact.describe()}"


def _under_sequence_test(loop: ast.AST, indexed: ast.expr, scope: ast.AST) -> bool:
    """``loop`` sits in the body of an ``if isinstance(x, list):`` (or ``x[0]``) of the name
    at the root of ``indexed``: what it indexes holds whole tensors, not rows."""
    root = indexed
    while isinstance(root, ast.Subscript):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    for node in walk(scope):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (
            isinstance(test, ast.Call)
            and len(test.args) == 2
            and isinstance(test.args[0], ast.Subscript)
            and isinstance(test.args[0].value, ast.Name)
        ):
            test = ast.Call(test.func, [test.args[0].value, test.args[1]], [])
        if _tests_sequence(test, {root.id}) and any(
            sub is loop for part in node.body for sub in walk(part)
        ):
            return True
    return False


def _counters(loop: ast.AST) -> set[str]:
    """The counter names of a loop over ``range(n)`` (also under ``tqdm``/``reversed``), not
    over a few constant steps (``range(3)``). (Not the index of ``enumerate(words)``: that
    counts the items of another sequence, a few top-k words.)"""
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        pairs = [(loop.target, loop.iter)]
    elif isinstance(loop, _COMPS):
        pairs = [(g.target, g.iter) for g in loop.generators]
    else:
        return set()
    found: set[str] = set()
    for target, it in pairs:
        while (
            isinstance(it, ast.Call)
            and dotted_name(it.func) in {"tqdm", "tqdm.tqdm", "reversed"}
            and it.args
        ):
            it = it.args[0]
        if not (
            isinstance(target, ast.Name)
            and isinstance(it, ast.Call)
            and dotted_name(it.func) in {"range", "trange", "tqdm.trange"}
            and it.args
        ):
            continue
        if all(isinstance(a, ast.Constant) for a in it.args) and len(it.args) <= 2:
            bound = it.args[-1].value  # type: ignore[attr-defined]
            if type(bound) is int and bound <= _FEW:
                continue  # `for i in range(3):` a few steps (a model's heads, a debug image)
        found.add(target.id)
    return found


def _indexed_by(receiver: ast.expr, counters: set[str]) -> ast.expr | None:
    """``imgs`` of ``imgs[k]``, ``imgs[k, :]``, ``dets[0, k]``, ``imgs[k][0]`` or
    ``imgs[k].float()`` with ``k`` a counter: the tensor whose row the receiver is (not a
    slice by it, ``x[k : k + n]``, a chunk)."""
    node = receiver
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Attribute):
                return None
            node = node.func.value
        elif isinstance(node, ast.Attribute):
            node = node.value
        else:
            index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(isinstance(i, ast.Name) and i.id in counters for i in index):
                return node.value  # `x[k]`, `x[k, :]`, `dets[0, k, 1:]`: one row or column
            node = node.value
    return None


def _tests_sequence(test: ast.expr, names: set[str]) -> bool:
    """``isinstance(out, list)``, ``isinstance(out, (list, tuple))``, also joined by ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_tests_sequence(value, names) for value in test.values)
    tested = isinstance_test(test)
    if tested is None or tested[0] not in names:
        return False
    elements = tested[1]
    return bool(elements) and all(
        (isinstance(kind, ast.Name) and kind.id in _SEQUENCES)
        or (isinstance(kind, ast.Attribute) and kind.attr in _SEQUENCES)  # `abc.Sequence`
        for kind in elements
    )


def _copies_whole(own: list[ast.AST]) -> bool:
    """A loop step copies whole tensors to the host (``.cpu()``, ``.numpy()``, ``.tolist()``),
    as a sampler's gathered images are, rather than reading one number per item."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"cpu", "numpy", "tolist"}
        for node in own
    )


def _walks_gathered(facts: FileFacts, iters: list[ast.expr], scope: ast.AST) -> bool:
    """The loop walks the list a gather collective fills with one tensor per rank
    (:func:`_gathered_into`: ``dist.gather(x, gather_list=parts, dst=0)``, axolotl's per-rank
    metric read with ``.item()``), each rank's a value it packs (:func:`_packed`): a pass over
    the ranks after one collective, not over batches."""
    names = {it.id for it in iters if isinstance(it, ast.Name)}
    for node in walk(scope) if names else ():
        if not isinstance(node, ast.Call) or not node.args:
            continue
        filled = _gathered_into(node, facts)
        if not (isinstance(filled, ast.Name) and filled.id in names):
            continue
        # `all_gather(parts, x)` sends its second argument, `gather(x, parts)` its first
        sent = node.args[1] if filled is node.args[0] and len(node.args) > 1 else node.args[0]
        if _packed(facts, sent, scope):
            return True
    return False


def _packed(facts: FileFacts, sent: ast.expr, scope: ast.AST) -> bool:
    """``sent`` is a name the function binds only to a tensor constructor's packing of a value
    (``torch.tensor(fn(), device=d).float()``): a number each rank reports, not a result it
    computed on the device (``stats.cuda().cumsum(0)``)."""
    values = bindings(scope).get(sent.id, []) if isinstance(sent, ast.Name) else []

    def packs(value: ast.expr | None) -> bool:
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in {"to", "cuda", "float", "long", "int", "double"}
        ):
            value = value.func.value
        return isinstance(value, ast.Call) and facts.qualname(value.func) in _PACKERS

    return bool(values) and all(packs(v) for v in values)


def _gathers_host_values(facts: FileFacts, iters: list[ast.expr], scope: ast.AST) -> bool:
    """``for size in size_list`` after ``dist.all_gather(size_list, local_size)`` with
    ``local_size = torch.IntTensor([t.numel()]).to("cuda")``: host values (each rank's buffer
    size) packed for a collective, whose gathered copies must come back to the host; nothing
    is computed on the device."""
    names = {it.id for it in iters if isinstance(it, ast.Name)}
    if not names:
        return False
    bindings: dict[str, list[ast.expr]] = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bindings.setdefault(target.id, []).append(node.value)
    numbers = {name for name, values in bindings.items() if all(_host_number(v) for v in values)}
    packed = {
        name
        for name, values in bindings.items()
        if any(_packs_host_values(facts, value, numbers) for value in values)
        and all(
            _packs_host_values(facts, value, numbers)
            or _host_number(value)
            or _moves_itself(value, name)
            for value in values
        )
    }
    return any(
        isinstance(node, ast.Call)
        and (facts.qualname(node.func) or "").endswith("distributed.all_gather")
        and len(node.args) == 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in names
        and (
            (isinstance(node.args[1], ast.Name) and node.args[1].id in packed)
            or _packs_host_values(facts, node.args[1], numbers)  # packed in the call itself
        )
        for node in walk(scope)
    )


def _unpickles_gathered(
    facts: FileFacts, loop: ast.AST, iters: list[ast.expr], scope: ast.AST
) -> bool:
    """``for size, t in zip(size_list, tensor_list): pickle.loads(t.cpu().numpy().tobytes())``
    after ``dist.all_gather(tensor_list, t)`` (or ``dist.gather(t, tensor_list, dst=dst)``):
    an object all-gather or gather, one pickled buffer per rank; each must come back to the
    host to be decoded, once per rank, not per batch."""
    names = {
        arg.id
        for it in iters
        for arg in (
            it.args
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip"
            else [it]
        )
        if isinstance(arg, ast.Name)
    }
    if not names or not any(
        isinstance(node, ast.Call) and facts.qualname(node.func) == "pickle.loads"
        for node in walk(loop)
    ):
        return False
    return any(
        isinstance(node, ast.Call)
        and isinstance(received := _gathered_into(node, facts), ast.Name)
        and received.id in names
        for node in walk(scope)
    )


def _gathered_into(call: ast.Call, facts: FileFacts) -> ast.expr | None:
    """The list a collective gathers into: ``dist.all_gather(outputs, t)``'s first argument,
    ``dist.gather(t, outputs, dst=0)``'s second (or ``gather_list=``)."""
    name = facts.qualname(call.func) or ""
    if name.endswith("distributed.all_gather"):
        return call.args[0] if call.args else None
    if name.endswith("distributed.gather"):
        given = next((k.value for k in call.keywords if k.arg == "gather_list"), None)
        return call.args[1] if len(call.args) > 1 else given
    return None


def _moves_itself(value: ast.expr, name: str) -> bool:
    """``packed = packed.cuda()``, ``packed = packed.to(device)``: the packed values moved
    where the collective's backend needs them, still the same host values."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in {"to", "cuda"}
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name
    )


def _host_number(value: ast.expr) -> bool:
    """``local_size = int(local_size.item())``: the name rebound to a Python number once the
    gathered sizes are known, no longer a tensor; also ``h = int.from_bytes(digest, "little")``
    or ``n = len(items)``, a number the host computes."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id == "int"  # `int.from_bytes(...)`
    return isinstance(func, ast.Name) and func.id in {"int", "float", "len"}


def _packs_host_values(facts: FileFacts, value: ast.expr, numbers: set[str]) -> bool:
    """``torch.IntTensor([t.numel()]).to("cuda")``, ``torch.tensor([n], device=d)``: a list
    display of host values, packed (and moved); also a tensor's shape, ``torch.tensor(x.shape,
    device=x.device)``, or a Python number ``numbers`` names, ``torch.tensor(h, device=d)``
    with ``h = int.from_bytes(...)``: metadata each rank compares or pads to."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in {"to", "cuda"}
    ):
        value = value.func.value
    if not (
        isinstance(value, ast.Call) and facts.qualname(value.func) in _PACKERS and bool(value.args)
    ):
        return False
    first = value.args[0]
    if (
        isinstance(first, ast.Call)
        and isinstance(first.func, ast.Name)
        and first.func.id in {"list", "tuple"}
        and first.args
    ):
        first = first.args[0]  # `torch.tensor(list(x.shape))`
    return (
        isinstance(first, ast.List)
        or (isinstance(first, ast.Attribute) and first.attr == "shape")
        or (
            isinstance(first, ast.Call)
            and isinstance(first.func, ast.Attribute)
            and first.func.attr == "size"
            and not first.args
        )
        or (isinstance(first, ast.Name) and first.id in numbers)
    )


def _uploads_for_collective(
    facts: FileFacts, value: ast.expr, bound: set[str], own: list[ast.AST]
) -> bool:
    """``tensor = torch.tensor([m.avg for m in group], device=d)``, then
    ``dist.all_reduce(tensor)`` in the same step: host values packed for a collective, whose
    result must come back to the host; nothing is computed on the device. Also packed, then
    moved: ``avg = torch.tensor(avg).cuda()``."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in {"to", "cuda"}
    ):
        value = value.func.value
    if not (
        isinstance(value, ast.Call)
        and facts.qualname(value.func) in {"torch.tensor", "torch.as_tensor"}
    ):
        return False
    return any(
        isinstance(node, ast.Call)
        and (facts.qualname(node.func) or "").startswith("torch.distributed.")
        # `dist.all_reduce(tensor)`, or the input of `dist.all_gather(outputs, tensor)`
        and any(isinstance(arg, ast.Name) and arg.id in bound for arg in node.args[:2])
        for node in own
    )


def feeds_back(loop: ast.AST) -> bool:
    """Each step of ``loop`` starts from a value the previous step left (a decoding loop's
    ``token``, read at the top of the body and rebound below): a step per token, not per
    fresh input."""
    parts = _parts(loop)
    if parts is None:
        return False
    own, _ = _split_own(parts[1])
    return bool(_carried(own))


def _carried(own: list[ast.AST]) -> set[str]:
    """Names a loop body reads before it binds them: each step starts from the value the
    previous step left (``token`` fed to the model, then drawn from its output)."""
    first_bound: dict[str, int] = {}
    for node in own:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _target_names(target):
                    line = first_bound.get(name)
                    if line is None or node.lineno < line:
                        first_bound[name] = node.lineno
    return _read_before(own, first_bound)


def _grown_back(own: list[ast.AST]) -> set[str]:
    """Names a loop body reads before it grows them in place (``trg_indexes.append(token)``
    at the end of a greedy decoding step, read at its top by ``torch.LongTensor(trg_indexes)
    .to(device)``): each step starts from what the previous step added."""
    grown: dict[str, int] = {}
    for node in own:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"append", "extend", "insert"}
            and isinstance(node.func.value, ast.Name)
        ):
            name = node.func.value.id
            grown[name] = max(grown.get(name, 0), node.lineno)
    return _read_before(own, grown)


def _read_before(own: list[ast.AST], lines: dict[str, int]) -> set[str]:
    """The names of ``lines`` that ``own`` reads above the line each maps to."""
    return {
        node.id
        for node in own
        if isinstance(node, ast.Name)
        and isinstance(node.ctx, ast.Load)
        and node.id in lines
        and node.lineno < lines[node.id]
    }


def _step_call(facts: FileFacts, call: ast.Call, scope: ast.AST) -> tuple[LoopKind, str] | None:
    """A call that runs device work per step: a moved model, or a training step function."""
    func = call.func
    runs = isinstance(func, ast.Name) or (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )  # `model(x)`, `facts.model(x)`; `model.state_dict()` is a method, not a run
    if runs and not facts.qualname(func):
        fact = facts.fact(func, scope)
        if fact is not None and fact.on_device and _names(func) - {"self"}:
            name = _short(facts.segment(func), 24)
            return "batch", f"it runs `{name}` on every step ({fact.describe()})"
    if isinstance(func, ast.Name) and func.id == "self" and _module_method(facts, scope):
        # a module's own decoding loop, `outputs = self(**model_inputs)` in `generate`
        return "batch", "it runs the module's own `forward` (`self(...)`) on every step"
    if isinstance(func, ast.Attribute) and func.attr in _FRAMEWORK_STEPS:
        name = _short(facts.segment(func), 32)
        return "batch", f"it calls the framework step `{name}` on every step"
    callee = facts.local_def(func, scope)
    if callee is not None and _is_step_function(callee):
        return "batch", f"it calls the training step `{callee.name}` on every step"
    return None


def _module_method(facts: FileFacts, scope: ast.AST) -> bool:
    """``scope`` is a method of an ``nn.Module`` class of the file."""
    cls = facts.parent.get(id(scope))
    return isinstance(cls, ast.ClassDef) and facts.resolver.is_module_class(cls)


def _moves_handed(facts: FileFacts, call: ast.Call, derived: set[str], scope: ast.AST) -> bool:
    """``losses = self.load_data_compute_loss(data)`` with ``data`` what the loop iterates,
    and a method of the class (or a function of the file) that moves its first parameter, or
    items of it, to a device (``rgb = data["rgb"].to(self.device)``): each step's batch goes
    to the device through the helper."""
    if not call.args or not isinstance(call.args[0], ast.Name) or call.args[0].id not in derived:
        return False
    func = call.func
    if isinstance(func, ast.Name):
        found = [node for _, node in facts.callees(func.id, facts.qualname(func))]
        skip = 0
    else:
        method = facts.local_def(func, scope)  # `self.load_data_compute_loss(data)`
        found = [method] if method is not None else []
        skip = 1
    if len(found) != 1:
        return False
    params = [a.arg for a in [*found[0].args.posonlyargs, *found[0].args.args]][skip:]
    if not params:
        return False
    first = params[0]
    for sub in walk(found[0]):
        if not (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)):
            continue
        if not (_is_move_call(sub) and moves_to_device(sub, facts.qualname)):
            continue
        if _is_cpu(_device_target(sub)):
            continue
        root = sub.func.value
        while isinstance(root, (ast.Subscript, ast.Attribute)):
            root = root.value
        if isinstance(root, ast.Name) and root.id == first:
            return True
    return False


def _fetches_batch(
    facts: FileFacts, call: ast.Call, name: str, scope: ast.AST
) -> tuple[LoopKind, str] | None:
    """A call named for fetching a batch that hands back device values: ``X, Y =
    get_batch("val")`` in nanoGPT's ``for k in range(eval_iters):``, whose helper samples
    rows and moves them (``x.pin_memory().to(device, non_blocking=True)``): each turn
    takes a fresh batch on the device, whatever the loop counts."""
    words = [w for w in name.lower().split("_") if w]
    if not words or not words[-1].endswith(("batch", "batches")):
        return None  # `get_batch`, `next_minibatch`; not `batchify(fn, x, bs, device, k=k)`
    fact = facts.fact(call, scope)
    if fact is None or not fact.on_device:
        return None
    what = _short(facts.segment(call), 32)
    return "batch", f"it fetches a device batch with `{what}` on every step ({fact.describe()})"


# The step methods of training frameworks (Lightning's hooks, the Hugging Face Trainer's
# `training_step`/`prediction_step`): each runs the model on one batch the framework moved.
_FRAMEWORK_STEPS = frozenset(
    {"training_step", "validation_step", "test_step", "predict_step", "prediction_step"}
)


def moves_some(loop: ast.For | ast.AsyncFor) -> bool:
    """The loop moves one of its own targets to a device (``x = x.to(device)``), also through
    a name bound to an item of one (``videos = batch[0]``, then ``videos.to(device)``), a
    tensor a method builds from one (``x.float().cuda()``, ``src.new_full(s, v).to(device)``),
    or one joined from one (``torch.stack(images, dim=0).to(device)``)."""
    targets = set(_target_names(loop.target))
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Subscript, ast.Attribute)):
            root = stmt.value.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value  # batch["net_input"]["src_tokens"]
            if isinstance(root, ast.Name) and root.id in targets:
                for target in stmt.targets:
                    targets |= set(_target_names(target))
    for stmt in loop.body:
        for sub in walk(stmt):
            if isinstance(sub, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
                targets |= _walked_parts(sub, targets)
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"to", "cuda"}
                and (_chain_root(sub.func.value) in targets or _stacked(sub.func.value) in targets)
            ):
                return True
    return False


# Functions that join a list of tensors into one: what a collate function left as a list.
_JOINS = frozenset({"torch.stack", "torch.cat", "torch.concat", "torch.vstack", "torch.hstack"})


def _stacked(node: ast.expr) -> str | None:
    """The item a join is built from: ``images`` of ``torch.stack(images, dim=0)``, moved
    whole (``torch.stack(images).to(device)``) beside a ``targets`` it leaves on the host."""
    if isinstance(node, ast.Call) and dotted_name(node.func) in _JOINS and node.args:
        return _chain_root(node.args[0])
    return None


def _walked_parts(
    comp: ast.ListComp | ast.GeneratorExp | ast.SetComp | ast.DictComp, targets: set[str]
) -> set[str]:
    """The names a comprehension binds to the parts of one of ``targets``: ``img`` of
    ``list(img.to(device) for img in images)``, also nested, ``k, v`` of ``[{k: v.to(device)
    for k, v in t.items()} for t in targets]`` (the inner one is walked after this one)."""
    found: set[str] = set()
    for gen in comp.generators:
        if _chain_root(gen.iter) in targets | found:
            found |= set(_target_names(gen.target))
    return found


def _chain_root(node: ast.expr) -> str | None:
    """The name a chain of method calls starts from: ``x`` of ``x.float().half()``, also
    through an item of it, ``batch`` of MONAI's ``batch["label"].to(device)``."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr not in {"to", "cuda"}
        ):
            node = node.func.value
        else:
            break
    return node.id if isinstance(node, ast.Name) else None


def _resets_epoch(call: ast.Call, own: list[ast.AST], nested_batch_lines: list[int]) -> bool:
    """``optimizer.zero_grad()`` before the nested batch loop of an epoch loop that steps no
    optimizer itself: a reset once per epoch. After the nested loop (gradients accumulated over
    micro-steps, then flushed), or next to a ``scaler.step(optimizer)``, it marks a step. A
    nested validation loop may come first (ACT's epoch loop: validate, ``zero_grad()``, train):
    the reset only has to come before one of the nested loops."""
    if not nested_batch_lines or call.lineno >= max(nested_batch_lines):
        return False
    return not any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "step"
        and not _names_scheduler(sub.func.value)
        for sub in own
    )


def _collective_uploads(facts: FileFacts, own: list[ast.AST]) -> set[int]:
    """The moves of a loop step that upload host values packed for a collective of the same
    step, ``avg = torch.tensor(avg).cuda()``, then ``dist.reduce(avg, dst=0)``: a metric's
    average reduced once per metric, not a batch (see :func:`_uploads_for_collective`)."""
    return {
        id(node.value)
        for node in own
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and _is_move_call(node.value)
        and _uploads_for_collective(facts, node.value, _bound_names(node), own)
    }


def _offloaded(facts: FileFacts, own: list[ast.AST]) -> set[int]:
    """The moves of a loop step that only offload what the step works on: a statement that
    moves a name or attribute to the device in place and discards the result (a module's own
    move, ``prev_op.cuda()``), with a statement of the same step moving it back to the CPU
    (``prev_op.cpu()``). llm-awq's ``apply_scale`` walks a model's layers so, one at a time on
    the GPU: a walk over layers, not over batches."""
    statements: list[tuple[ast.Call, ast.Attribute]] = [
        (node.value, node.value.func)
        for node in own
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and isinstance(node.value.func.value, (ast.Name, ast.Attribute))
    ]
    back = {
        facts.segment(func.value)
        for call, func in statements
        if (func.attr == "cpu" and not call.args and not call.keywords)
        or (func.attr == "to" and _is_cpu(_device_target(call)))
    }
    return {
        id(call)
        for call, func in statements
        if _is_move_call(call)
        and not _is_cpu(_device_target(call))
        and facts.segment(func.value) in back
    }


def _split_own(body: list[ast.AST]) -> tuple[list[ast.AST], list[ast.AST]]:
    """A loop body's own nodes (not inside nested loops or scopes), and its nested loops.
    A nested loop that only moves the items of a mapping in place (``for k in batch:
    batch[k] = batch[k].to(device)``) is part of the body's step, not a loop of its own."""
    own: list[ast.AST] = []
    nested: list[ast.AST] = []
    todo = list(reversed(body))
    used: frozenset[str] | None = None
    while todo:
        sub = todo.pop()
        if isinstance(sub, _LOOPS) and not _moves_items(sub):
            nested.append(sub)
            continue
        own.append(sub)
        if isinstance(sub, _SCOPES):
            if isinstance(sub, _FUNCTIONS):
                used = _names_used(tuple(body)) if used is None else used
                if sub.name in used and not sub.decorator_list:
                    # `def train_step(): ...` then `gpu_timer(train_step)`, a closure handed
                    # on or called where it is defined: its body runs as part of this one
                    todo.extend(reversed(sub.body))
            continue
        todo.extend(reversed(children(sub)))
    return own, nested


@lru_cache(maxsize=1024)
def _names_used(body: tuple[ast.AST, ...]) -> frozenset[str]:
    """The names a block reads outside its nested loops (a closure called in a nested loop,
    Open-Sora's ``run_iter`` in ``main``'s loop over batches, runs per step of that loop, not
    as part of the block)."""
    found: set[str] = set()
    todo = list(body)
    while todo:
        sub = todo.pop()
        if isinstance(sub, _LOOPS):
            continue
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            found.add(sub.id)
        todo.extend(children(sub))
    return frozenset(found)


def _moves_items(loop: ast.AST) -> bool:
    """``for key in batch.keys(): batch[key] = batch[key].to(device)`` (also under an ``if``
    that picks the device, or a ``continue`` that skips some keys): a loop whose every
    statement moves an item of a mapping in place."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or loop.orelse:
        return False
    leaves = [stmt for stmt in _leaves(loop.body) if not isinstance(stmt, ast.Continue)]
    return bool(leaves) and all(
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and moved_in_place(stmt.targets[0], stmt.value) is not None
        for stmt in leaves
    )


def _leaves(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body``, with each ``if`` replaced by the leaves of its branches."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            out += _leaves(stmt.body) + _leaves(stmt.orelse)
        else:
            out.append(stmt)
    return out


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


def _is_step_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A training step: calls ``.backward()`` or an optimizer step, outside any loop of its own."""
    own, _ = _split_own(list(node.body))
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "backward"
        for sub in own
    )


def steps_optimizer(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """One whole training step, outside any loop of its own: ``.backward()`` and an optimizer
    step (``self.opt.step()``, ``scaler.step(optimizer)``). Whoever calls it, each call is one
    step of training, so it runs once per batch (a recommender's ``stage_one(users, items)``,
    a GAN engine's per-iteration function)."""
    backward, stepped = step_parts(node)
    return backward and stepped


def step_parts(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, bool]:
    """Whether ``node`` calls ``.backward()`` and whether it steps an optimizer, each outside
    any loop of its own; neither when it walks the batches itself (an epoch)."""
    own, nested = _split_own(list(node.body))
    steps_after = any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "step"
        and _steps_an_optimizer(sub)
        for sub in own
    )
    # the micro-steps of one step: `for _ in range(gradient_accumulation_steps): loss.backward()`,
    # also over the micro-batches, `for batch in batch_iter: loss.backward()`, then one
    # `optimizer.step()` after the loop
    micro_loops = [
        loop for loop in nested if _accumulates(loop) or (steps_after and _backward_only(loop))
    ]
    if any(
        isinstance(loop, (ast.For, ast.AsyncFor))
        and _iterates_batches(loop)
        and loop not in micro_loops
        for loop in nested
    ):
        return False, False  # an epoch: it walks the batches itself
    backward = stepped = False
    micro = [sub for loop in micro_loops for sub in walk(loop)]
    for sub in [*own, *micro]:
        if not isinstance(sub, ast.Call) or not isinstance(sub.func, ast.Attribute):
            continue
        if sub.func.attr == "backward" or _wrapped_step(sub):
            backward = True
        if sub.func.attr == "step" and _steps_an_optimizer(sub):
            stepped = True
    return backward, stepped


def _backward_only(loop: ast.AST) -> bool:
    """A loop that runs backward passes and steps no optimizer: it accumulates gradients for
    a step taken after it."""
    backward = stepped = False
    for sub in walk(loop):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            backward = backward or sub.func.attr == "backward"
            stepped = stepped or (sub.func.attr == "step" and _steps_an_optimizer(sub))
    return backward and not stepped


def _wrapped_step(call: ast.AST) -> bool:
    """``self.optim.step(loss)``: an optimizer wrapper handed the loss (Tianshou's
    ``Optimizer.step(loss)`` runs ``zero_grad``, ``loss.backward()`` and the step), not
    ``optimizer.step(closure)`` nor ``scaler.step(optimizer)``."""
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "step"
        and len(call.args) == 1
    ):
        return False
    if not _names_optimizer(call.func.value):
        return False
    names = [
        dotted_name(sub) for sub in walk(call.args[0]) if isinstance(sub, (ast.Name, ast.Attribute))
    ]
    return any("loss" in (name or "").rpartition(".")[2].lower() for name in names)


def _steps_an_optimizer(call: ast.Call) -> bool:
    """``optimizer.step()``, ``self.G_optimizer.step()``, ``scaler.step(opt)``: a name for an
    optimizer (``opt`` as the start of a word), not a scheduler's or an environment's step."""
    assert isinstance(call.func, ast.Attribute)
    return any(_names_optimizer(node) for node in [call.func.value, *call.args[:1]])


def _names_optimizer(node: ast.expr) -> bool:
    """``optimizer``, ``self.G_optimizer``, ``opt``: ``opt`` as the start of a word of the
    last name; also an entry of a mapping of them, ``self.optimizers["critic"]``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    last = (dotted_name(node) or "").rpartition(".")[2].lower()
    return any(word.startswith("opt") for word in last.split("_"))


def has_own_batch_loop(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function that iterates a loader itself (an epoch function, not a step)."""
    _, nested = _split_own(list(node.body))
    for loop in nested:
        if isinstance(loop, (ast.For, ast.AsyncFor)) and _iterates_batches(loop):
            return True
        if _accumulates(loop):
            continue  # the micro-batches of one step, not an epoch
        for stmt in loop.body:  # type: ignore[attr-defined]
            for sub in walk(stmt):
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in {"backward", "to", "cuda"}
                ):
                    return True
    return False


_ACCUMULATION_WORDS = ("accum", "micro")


def _accumulation_count(node: ast.expr) -> bool:
    """``accum_grad``, ``args.gradient_accumulation_steps``, ``update_freq``: the micro-batches of one
    optimizer step, by the name's words; ``(i + 1) % accum_grad == 0`` is that step's cadence
    (every step of the optimizer), not a logging interval."""
    name = (dotted_name(node) or "").rsplit(".", 1)[-1].lower()
    return "accum" in name or name.endswith("update_freq")  # fairseq's and ConvNeXt's name


def _accumulates(loop: ast.AST) -> bool:
    """``for _ in range(neox_args.gradient_accumulation_steps):``, ``range(config[
    "num_G_accumulations"])``: the micro-batches of one training step, by the count's name."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call):
        return False
    if call_name(loop.iter) != "range":
        return False
    words = [
        (dotted_name(sub) or "") if not isinstance(sub, ast.Constant) else str(sub.value)
        for arg in loop.iter.args
        for sub in walk(arg)
        if isinstance(sub, (ast.Name, ast.Attribute, ast.Constant))
    ]
    return any(w in word.lower() for word in words for w in _ACCUMULATION_WORDS)


def _iterates_batches(loop: ast.For | ast.AsyncFor) -> bool:
    """A loop over a name for batches or what yields them (``for x in train_loader:``)."""
    return any(
        isinstance(sub, (ast.Name, ast.Attribute))
        and _names_batches(sub.id if isinstance(sub, ast.Name) else sub.attr)
        for sub in walk(loop.iter)
    )


_BATCH_WORDS = ("loader", "dataset", "batch")
# Words that end an iterator's name after what it yields (`batch_iter`, `loader_it`).
_ITER_WORDS = frozenset({"iter", "iterator", "it", "gen", "generator", "stream"})


def _names_batches(name: str) -> bool:
    """A name for batches or what yields them, by the noun that ends it (``train_loader``,
    ``num_batches``, ``batch_iter``), not for what one batch holds (``batch_size``,
    ``banned_batch_tokens``): ``range(batch_size)`` walks the rows of one batch."""
    words = [w for w in name.lower().split("_") if w]
    while len(words) > 1 and words[-1] in _ITER_WORDS:
        words.pop()
    return bool(words) and any(word in words[-1] for word in _BATCH_WORDS)


def calls_backward(loop: ast.AST) -> bool:
    return any(
        (isinstance(sub, ast.Attribute) and sub.attr == "backward") or _wrapped_step(sub)
        for sub in walk(loop)
    )


# (`torch.is_anomaly_enabled()`: autograd's anomaly mode, a debugging mode)
_RARE_WORDS = ("every", "interval", "verbose", "debug", "print_freq", "freq", "anomaly")
# "log" as a word of the name (`log_every`, `should_log`, `logging_steps`, `logger`), not as
# the start of another word (`logits`, `logprobs`, `log_softmax` name data, not logging).
_LOG_WORDS = frozenset({"log", "logs", "logging", "logger", "logged", "tensorboard", "wandb"})


def _names_logging(text: str) -> bool:
    lowered = text.lower()
    if any(word in lowered for word in _RARE_WORDS):
        return True
    parts = lowered.split("_")
    return any(part in _LOG_WORDS for part in parts) or lowered.endswith(("logging", "logger"))


def rare_test(test: ast.expr) -> bool:
    """A branch test that holds on few steps: ``step % every == 0``, ``i == 0``, ``n < 10``, or
    one naming logging or debugging (``if args.verbose:``), or ``and`` with one of these
    (``plots and i < 3``). An identity test (``if log_writer is not None:``) asks whether a
    setting is there, on every step or on none: never rare by itself. A remainder tested for
    truth (``if step % 50:``, ``step % 50 != 0``) holds on every step but one in N: frequent."""
    if remainder_nonzero(test):
        return False
    if any(
        isinstance(sub, ast.BinOp)
        and isinstance(sub.op, ast.Mod)
        and _accumulation_count(sub.right)
        for sub in _outside_identity_tests(test)
    ):
        return False  # `(i + 1) % accum_grad == 0`: every step of the optimizer
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        # each operand by itself: `if self.log_coef is not None and ...` names no logging
        return any(rare_test(value) for value in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        right = test.comparators[0]
        number = isinstance(right, ast.Constant) and type(right.value) is int
        if isinstance(test.ops[0], ast.Is) and number:
            # `i % 100 is 0`: an identity test of a small int, read as `==`
            return rare_test(ast.Compare(left=test.left, ops=[ast.Eq()], comparators=[right]))
        if isinstance(test.ops[0], (ast.Is, ast.IsNot)):
            # `if log_writer is not None:`: whether a setting is present, the same on every
            # step (all of them or none), whatever the name says; a debugging setting
            # (`if debug_percentile is not None:`) is off in the runs that matter
            return "debug" in (dotted_name(test.left) or "").lower()
        if isinstance(right, ast.Constant) and isinstance(right.value, int):
            op = test.ops[0]
            if isinstance(op, ast.Eq) or (isinstance(op, (ast.Lt, ast.LtE)) and right.value <= 100):
                # `len(x) == 0` tests data, so does `mask[t] == 1` (an element the loop picks
                # by a variable index); `rank == 0` holds on every step of the main process
                return (
                    not isinstance(test.left, ast.Call)
                    and not _picks_element(test.left)
                    and not _names_rank(test.left)
                    and not _names_setting(test.left)
                )
    for sub in _outside_identity_tests(test):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
            return True
        text = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", "")
        if text and _names_logging(text) and not _backend_setting(sub, text):
            return True
    return False


# Where a run reports its metrics: a setting naming one is on for the whole run or off.
_BACKENDS = ("wandb", "tensorboard", "mlflow", "neptune", "comet", "visdom", "clearml")


def _backend_setting(node: ast.AST, text: str) -> bool:
    """``args.report_to_wandb``, ``cfg.use_tensorboard``: a run's setting that picks where it
    reports, the same on every step (not a flag for a few steps, as ``args.verbose`` is
    rarely on, nor ``should_log``)."""
    return (
        isinstance(node, ast.Attribute)
        and _names_setting(node)
        and any(word in text.lower() for word in _BACKENDS)
    )


def _picks_element(node: ast.expr) -> bool:
    """``mask[t]``, ``best[b, t]``: an element picked by a variable index (data), not a
    setting picked by a constant key (``cfg["every"]``)."""
    if not isinstance(node, ast.Subscript):
        return False
    index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return any(isinstance(i, ast.Name) for i in index)


def _outside_identity_tests(test: ast.expr) -> list[ast.AST]:
    """The nodes of ``test`` outside its identity tests (``x is not None``), which ask whether
    a setting is there, whatever its name says."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [test]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops
        ):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def guard_test(
    stmt: ast.AST, leaves: tuple[type[ast.stmt], ...] = (ast.Return, ast.Continue)
) -> ast.expr | None:
    """The test of ``if test: return`` (or ``continue``, or another of ``leaves``) with
    nothing else in it: a guard after which the block runs only when ``test`` is false."""
    if (
        isinstance(stmt, ast.If)
        and not stmt.orelse
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], leaves)
    ):
        return stmt.test
    return None


def remainder_nonzero(test: ast.expr) -> bool:
    """``step % n`` as a truth value, or compared unequal to zero (``step % n != 0``,
    ``step % n > 0``): true on all steps but the multiples of ``n``."""
    if isinstance(test, ast.BinOp):
        return isinstance(test.op, ast.Mod)
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.NotEq, ast.Gt))
        and isinstance(test.left, ast.BinOp)
        and isinstance(test.left.op, ast.Mod)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 0
    )


# Names that hold a run's settings: the parsed command line, a configuration object.
_SETTINGS_HOLDERS = frozenset(
    {"args", "opt", "opts", "cfg", "config", "conf", "hparams", "hps", "flags", "FLAGS"}
)


def _names_setting(node: ast.expr) -> bool:
    """``args.augment_p``, ``self.cfg.warmup``: a setting of the run, which holds the same
    value on every step (``if args.augment_p == 0:`` is true on all steps or on none)."""
    name = dotted_name(node)
    if name is None or "." not in name:
        return False
    return any(part in _SETTINGS_HOLDERS for part in name.split(".")[:-1])


#: the last word of a count of processes or GPUs: ``world_size``, ``num_gpus``, ``nprocs``
_RANK_COUNT = re.compile(r"(.*world_size|n_?gpus|num_?gpus|n_?procs|num_?procs|num_processes)")


def _walks_ranks(it: ast.expr) -> bool:
    """``range(self.world_size)``, ``range(dist.get_world_size())``, ``range(num_gpus)``: the
    ranks of a process group (or the GPUs of one), each step one rank's turn (the source of a
    broadcast of its state), not a batch."""
    if not (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
    ):
        return False
    bound = it.args[0]
    name = dotted_name(bound.func if isinstance(bound, ast.Call) else bound)
    return name is not None and _RANK_COUNT.fullmatch(name.rsplit(".", 1)[-1].lower()) is not None


def _names_rank(node: ast.expr) -> bool:
    """``rank``, ``args.local_rank``, ``self.global_rank``, ``self.config["global_rank"]``:
    which process this is."""
    name = _keyed_name(node)
    return name is not None and "rank" in name.rsplit(".", 1)[-1].lower().split("_")


def _keyed_name(node: ast.expr) -> str | None:
    """:func:`dotted_name`, with a lookup by a constant string key read as an attribute:
    ``self.config["global_rank"]`` is ``self.config.global_rank``."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.slice.value}"
    return dotted_name(node)


def branch_trains(branch: ast.If) -> bool:
    """The branch runs a training step itself (``backward``, an optimizer ``step``): every N
    steps is then how often it trains, and its reads are per step of that training. A
    learning-rate scheduler's ``step`` (``scheduler.step(val_score)`` after an evaluation)
    trains nothing, and neither does a read of a step counter (lingua's logging branch
    formats ``f"step: {train_state.step}"``): only a call of ``.step`` is a step. Nor does an
    environment's ``test_data = env.step(policy(env.reset()))`` in an evaluation branch, nor
    a step given a count (``policy[1].step(frames)``)."""
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr in {"backward", "step"}
        and not (
            sub.func.attr == "step"
            and (
                _names_scheduler(sub.func.value)
                or _names_environment(sub.func.value)
                or not _steps_parameters(sub)
            )
        )
        for stmt in branch.body
        for sub in walk(stmt)
    )


def _steps_parameters(call: ast.Call) -> bool:
    """``optimizer.step()``, ``optimizer.step(closure)``, ``scaler.step(optimizer)``: a step
    of the parameters. Not a step given a count, ``policy[1].step(frames)`` (TorchRL's
    exploration-noise annealing), which trains nothing."""
    if not call.args:
        return True
    first = call.args[0]
    if isinstance(first, ast.Lambda):
        return True
    name = (dotted_name(first) or "").rsplit(".", 1)[-1].lower()
    return name in {"opt", "optim", "closure"} or name.endswith(
        ("optimizer", "optimiser", "_opt", "_optim", "closure")
    )


def _names_environment(node: ast.expr) -> bool:
    """``env``, ``self.envs``, ``test_env``, ``eval_environment``: a simulator, whose
    ``step(action)`` advances an episode, not a training step."""
    name = dotted_name(node)
    last = (name or "").rsplit(".", 1)[-1].lower()
    return any(part in {"env", "envs", "environment"} for part in last.split("_"))


def _bound_to_scheduler(facts: FileFacts, node: ast.expr, scope: ast.AST) -> bool:
    """``lr_updater``, bound in the function (or the module) to a learning-rate scheduler of
    ``torch.optim.lr_scheduler`` (``lr_updater = lr_scheduler.StepLR(optimizer, 10)``): its
    ``step()`` moves the schedule once per epoch, not an optimizer once per batch."""
    name = dotted_name(node)
    if name is None:
        return False
    return any(
        isinstance(sub, ast.Assign)
        and isinstance(sub.value, ast.Call)
        and ".lr_scheduler." in (facts.qualname(sub.value.func) or "")
        and any(dotted_name(target) == name for target in sub.targets)
        for sub in [*walk(scope), *facts.tree.body]
    )


def _names_scheduler(node: ast.expr) -> bool:
    """``scheduler``, ``self.lr_scheduler``, ``sched``: a learning-rate schedule."""
    name = dotted_name(node)
    return name is not None and "sched" in name.rsplit(".", 1)[-1].lower()


def counter_names(loop: ast.For | ast.AsyncFor, scope: ast.AST | None = None) -> set[str]:
    """The names a loop binds to its step's index: ``i`` of ``for i in range(n):`` (also
    through ``tqdm``/``trange``, or through a progress bar ``scope`` binds once, TensoRF's
    ``pbar = tqdm(range(n_iters))``, then ``for iteration in pbar:``) or of ``for i, batch in
    enumerate(loader):``."""
    iterable, target = loop.iter, loop.target
    if isinstance(iterable, ast.Name) and scope is not None:
        iterable = _progress_bar(scope, iterable.id) or iterable
    while isinstance(iterable, ast.Call) and call_name(iterable) == "tqdm" and iterable.args:
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Call) and call_name(iterable) in {"range", "trange"}:
        return {target.id} if isinstance(target, ast.Name) else set()
    if (
        isinstance(iterable, ast.Call)
        and call_name(iterable) == "enumerate"
        and isinstance(target, ast.Tuple)
        and target.elts
        and isinstance(target.elts[0], ast.Name)
    ):
        return {target.elts[0].id}
    return set()


def _progress_bar(scope: ast.AST, name: str) -> ast.Call | None:
    """The ``tqdm(...)``/``trange(...)`` call that ``scope``'s own statements bind ``name`` to,
    when that is its only binding there."""
    values = bindings(scope).get(name, [])
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    return values[0] if call_name(values[0]) in {"tqdm", "trange"} else None


def below_restarted_mark(test: ast.expr, rest: list[ast.stmt]) -> bool:
    """``count < mark + every`` whose ``mark`` the statements of ``rest`` rebind."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Lt, ast.LtE))
        and isinstance(test.comparators[0], ast.BinOp)
        and isinstance(test.comparators[0].op, ast.Add)
    ):
        return False
    bound = test.comparators[0]
    return _rebound(rest, {dotted_name(side) for side in (bound.left, bound.right)} - {None})


def _rebound(block: list[ast.stmt], marks: set[str | None]) -> bool:
    """A statement of ``block`` (or one inside it) assigns one of ``marks``."""
    return any(
        isinstance(sub, ast.Assign) and any(dotted_name(t) in marks for t in sub.targets)
        for stmt in block
        for sub in walk(stmt)
    )


def restarts_mark(branch: ast.If) -> bool:
    """``if t[-1] - last_display > 1.0: last_display = t[-1]``, also ``if now - self.last >=
    every:`` and a step counter's ``if args.save_steps and step - last_save >= args.save_steps:
    ... last_save = step``: the branch restarts the mark it measures from, so it runs once per
    interval (a console line once a second, a checkpoint every N steps), not on every step."""
    test = branch.test
    terms = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for term in terms:
        if (
            isinstance(term, ast.Compare)
            and len(term.ops) == 1
            and isinstance(term.ops[0], (ast.Gt, ast.GtE))
            and isinstance(term.left, ast.BinOp)
            and isinstance(term.left.op, ast.Sub)
        ):
            mark = dotted_name(term.left.right)
            if mark is not None and _rebound(branch.body, {mark}):
                return True
    return False
