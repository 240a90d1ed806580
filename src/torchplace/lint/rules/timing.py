"""TPL3xx: timing device work with a host clock (pitfall 7: kernels are asynchronous)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from itertools import pairwise

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    bindings,
    call_name,
    has_star_kwargs,
    keyword,
    names_in,
    walk_body,
)
from torchplace.lint.nodes import children, parameter_defaults, walk
from torchplace.lint.provenance import FileFacts, file_facts, is_device_expr, scope_node
from torchplace.lint.provenance.loops import branch_trains
from torchplace.lint.provenance.values import _device_helper, _is_cpu, moved_in_place
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.factory_match import _cpu_path
from torchplace.lint.rules.facts import (
    CASTS,
    DEVICE_STRING,
    SYNC_CALLS,
    TIMERS,
    copies_to_cpu,
    is_env_step,
    moves_to_device,
    old_loss_read,
)
from torchplace.lint.rules.sync import _names_grad_scaler

__all__ = ["FAMILY"]

UNSYNCED_TIMING = Rule(
    "TPL301", "unsynchronized-timing", "host clock around device work without a synchronize"
)

# `type(img) == np.ndarray`, `isinstance(x, ...)` ask about a value; `Variable(img)` (torch <
# 0.4) wraps it: none of them launches device work.
_NOT_WORK = frozenset(
    {"print", "len", "range", "append", "info", "debug", "warning", "format"}
    | {"type", "isinstance", "Variable"}
    # a loop header's wrappers, `for i, pose in enumerate(tqdm(poses)):`: walking a placed
    # tensor hands out views of its rows, which launches no kernel
    | {"enumerate", "zip", "tqdm", "iter"}
    # `torch.compile(model)` wraps the module and returns at once: it compiles on the first
    # call, which is where the device work (and any wait) is
    | {"compile"}
    # a module's own bookkeeping, `optim.Adam(model.parameters())`: handles, no kernels
    | {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "children"}
)
# Tensor metadata, kept on the host: reading it launches no device work (``tuple(y[0].shape)``,
# ``y.size(0)``).
_METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
_METADATA_METHODS = frozenset({"size", "dim", "ndimension", "numel", "nelement", "get_device"})


def _assign(node: ast.Assign, ctx: Context) -> None:
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
        return
    value = node.value
    if not isinstance(value, ast.Call) or value.args or value.keywords:
        return
    clock = ctx.call_qualname(value)
    if clock not in TIMERS or not ctx.stmt_path:
        return
    start = node.targets[0].id
    scope = ctx.function_scope() or ctx.scope
    if not _subtracted(start, scope.node):
        return  # `end_time = timer()`, read only as `end_time - start_time`: a stop, not a start
    block, index = ctx.stmt_path[-1]
    found = _until_read(block[index + 1 :], start, ctx)
    if found is None:
        return  # no end read in this block: cannot tell what is timed
    region, rest = found
    if _limits(region[-1], start):
        return  # `if time.time() - t > time_limit: break`: a timeout, not a measurement
    if _cpu_path(node, scope):
        return  # the `else` of `if device.type == "cuda":`: the CPU path, which needs no sync
    placed = _device_names(scope, ctx, node.lineno)
    if not placed and not any(
        isinstance(sub, ast.Call) and _placed_here(sub, ctx) for sub in walk_body(region)
    ):
        return
    if not _times_work(region, placed - _host_bound(region, placed), ctx):
        later = [] if _restarts(region[-1], start, ctx) else _later_reads(rest, start, ctx)
        timed = region + later
        if not (later and _times_work(timed, placed - _host_bound(timed, placed), ctx)):
            return  # nor do the later reads of the same start (the batch time after the data time)
    ctx.report(
        UNSYNCED_TIMING.code,
        value,
        f"`{clock}()` times device work without a synchronize: kernels run asynchronously, so "
        "this measures the launch, not the work; call `torch.cuda.synchronize()` before each "
        "clock read or time with CUDA events",
    )


def _subtracted(start: str, scope: ast.AST) -> bool:
    """Some elapsed time is measured from ``start`` in its scope (``... - start``). A notebook
    that times two runs with ``start_time = timer()`` ... ``end_time = timer()`` binds
    ``end_time`` by a clock read too, but only ever subtracts from it: the work after it, up
    to the next run's ``start_time = timer()``, is timed by nothing."""
    return any(
        isinstance(sub, ast.BinOp)
        and isinstance(sub.op, ast.Sub)
        and isinstance(sub.right, ast.Name)
        and sub.right.id == start
        for sub in _live(scope)
    )


def _live(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` but for the bodies of ``if False:`` (``if 0:``): a profiling
    print switched off in the source (pytorch-yolo2's ``if False: print('total : %f' % (t4 -
    t0))``) measures nothing."""
    stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _never(node.test):
            stack.extend(reversed([node.test, *node.orelse]))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _never(test: ast.expr) -> bool:
    """A literal that is false: ``False``, ``0``, ``None``."""
    return isinstance(test, ast.Constant) and not test.value


def _host_bound(region: list[ast.AST], placed: set[str]) -> set[str]:
    """Names the function moves somewhere, but that the region binds afresh from host values
    before any use of them in it (``inputs, labels = batch``, then ``labels =
    torch.transpose(labels.view(n, k), 0, 1)``, with ``inputs = inputs.cuda()`` only further
    down the step): at the region's reads they still hold host data. A binding that moves the
    name, builds it with ``device=``, or computes from a placed value, keeps it placed."""
    binds: dict[str, list[ast.Assign | ast.AnnAssign]] = {}
    uses: dict[str, int] = {}
    for node in region:
        for sub in walk(node):
            if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for target in targets:
                    for name in names_in(target) & placed:
                        binds.setdefault(name, []).append(sub)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id in placed:
                uses[sub.id] = min(uses.get(sub.id, sub.lineno), sub.lineno)
    host = {
        name
        for name, stmts in binds.items()
        if min(stmt.lineno for stmt in stmts) < uses.get(name, 1 << 30)
    }
    changed = True
    while changed:
        changed = False
        for name in sorted(host):
            for stmt in binds[name]:
                value = stmt.value
                assert value is not None
                moved = any(
                    isinstance(sub, ast.Call)
                    and (call_name(sub) in _MOVES or keyword(sub, "device") is not None)
                    for sub in walk(value)
                )
                if moved or (names_in(value) & placed) - host:
                    host.discard(name)
                    changed = True
                    break
    return host


# Calls that place a value: a binding made with one keeps its name placed.
_MOVES = frozenset({"cuda", "to", "to_device", "prepare"})


def _times_work(region: list[ast.AST], placed: set[str], ctx: Context) -> bool:
    """The region runs device work and nothing in it waits for the device (on most steps:
    a wait inside ``if step % every == 0:`` before the clock's read is skipped on the others)."""
    # not the bodies of functions the region defines (`def train(epoch):` in a script): they
    # run, if at all, where they are called
    calls = [sub for sub in walk_body(region) if isinstance(sub, ast.Call)]
    periodic = _periodic_calls(region[:-1])
    decoded = _pipeline_outputs(region)
    periodic |= _batch_reads(calls, placed, ctx)
    if any(
        _syncs(call, ctx)
        or _reads_back(call, placed, ctx)
        or _runs_synced(call, ctx)
        or id(call) in decoded
        for call in calls
        if id(call) not in periodic
    ) or any(_tests_placed(node, placed) or _sized_by_values(node, placed) for node in region):
        return False
    if any(
        isinstance(sub, ast.Subscript) and old_loss_read(sub, ctx) is not None
        for node in region
        for sub in walk(node)
    ):
        return False  # `loss.data[0]`, `.item()` before PyTorch 0.4
    if _steps_env_with(calls, region, placed, ctx):
        return False
    copies = {  # also under an `if`: `if use_cuda: img = img.cuda()`
        id(sub)
        for node in region
        for stmt in walk(node)
        if isinstance(stmt, (ast.Assign, ast.Expr))
        for sub in _host_copy(stmt, placed, ctx)
    }
    # `torch.from_numpy(img.transpose(2, 0, 1))`: NumPy work on the host, whatever the name
    # is bound to later
    copies |= {
        id(sub)
        for call in calls
        if ctx.call_qualname(call) == "torch.from_numpy"
        for sub in walk(call)
    }
    return any(
        (_uses(call, placed, ctx) or _async_copy(call, ctx))
        for call in calls
        if call_name(call) not in _NOT_WORK
        and id(call) not in copies
        and not _mode_switch(call)
        and not (ctx.call_qualname(call) or "").startswith("torch.optim.")  # holds handles
    )


def _batch_reads(calls: list[ast.Call], placed: set[str], ctx: Context) -> set[int]:
    """The reads (by id) of a loader batch the code fetched by hand and never moved
    (``data = next(data_iter)`` with ``data_iter = iter(DataLoader(...))``, then
    ``scale = data[1][0][2].item()``): the collated batch is on the host, and reading it waits
    for nothing the device does. Not a batch the code moves (``data[0].cuda()``), nor one a
    ``collate_fn`` of its own builds (it may place the batch)."""
    reads = [
        call
        for call in calls
        if call_name(call) in {"item", "tolist", "numpy"}
        and isinstance(call.func, ast.Attribute)
        and not call.args
    ]
    if not reads:
        return set()
    body = getattr(scope_node(ctx), "body", None)
    if not isinstance(body, list):
        return set()
    nodes = list(walk_body(body))
    binds: dict[str, list[ast.expr]] = {}
    for sub in nodes:
        if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
            target = sub.targets[0]
            if isinstance(target, ast.Name):
                binds.setdefault(target.id, []).append(sub.value)
        elif isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            for name in names_in(sub.target):  # another binding: not the batch alone
                binds.setdefault(name, []).append(ast.Constant(None))

    def only(name: str, test: Callable[[ast.Call], bool]) -> ast.Call | None:
        values = binds.get(name, [])
        if len(values) == 1 and isinstance(values[0], ast.Call) and test(values[0]):
            return values[0]
        return None

    def loader(call: ast.Call) -> bool:
        return (call_name(call) or "").endswith("DataLoader") and keyword(
            call, "collate_fn"
        ) is None

    def iterator(call: ast.Call) -> bool:
        if call_name(call) != "iter" or len(call.args) != 1:
            return False
        source = call.args[0]
        if isinstance(source, ast.Call):
            return loader(source)
        return isinstance(source, ast.Name) and only(source.id, loader) is not None

    def batch(call: ast.Call) -> bool:
        return (
            isinstance(call.func, ast.Name)
            and call.func.id == "next"
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Name)
            and only(call.args[0].id, iterator) is not None
        )

    moved: set[str] = set()
    for sub in nodes:
        if isinstance(sub, ast.Call) and (
            call_name(sub) in _MOVES or keyword(sub, "device") is not None
        ):
            moved |= names_in(sub.func.value) if isinstance(sub.func, ast.Attribute) else set()
            moved |= {n for arg in sub.args for n in names_in(arg)}
    found: set[int] = set()
    for call in reads:
        assert isinstance(call.func, ast.Attribute)
        root: ast.expr = call.func.value
        while isinstance(root, (ast.Subscript, ast.Attribute)):
            root = root.value
        if (
            isinstance(root, ast.Name)
            and root.id not in placed
            and root.id not in moved
            and only(root.id, batch) is not None
        ):
            found.add(id(call))
    return found


def _steps_env_with(
    calls: list[ast.Call], region: list[ast.AST], placed: set[str], ctx: Context
) -> bool:
    """``action, _ = policy.get_action(obs)``, then ``env.step(action)``, with ``policy``
    placed: a host simulator steps on what the device computed, so each step waits for it
    (a timed rollout that collects data)."""
    computed = {
        name
        for node in region
        for stmt in walk(node)
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Call)
        and _uses(stmt.value, placed, ctx)
        for target in stmt.targets
        for name in names_in(target)
    }
    return any(
        is_env_step(call) and bool(names_in(call.args[0]) & (computed | placed)) for call in calls
    )


def _async_copy(call: ast.Call, ctx: Context) -> bool:
    """``x.to(device, non_blocking=True)``: a copy the host does not wait for."""
    flag = keyword(call, "non_blocking")
    return (
        call_name(call) in {"to", "cuda"}
        and flag is not None
        and not (isinstance(flag.value, ast.Constant) and not flag.value.value)
        and _places(call, ctx)
    )


def _host_copy(stmt: ast.AST, placed: set[str], ctx: Context) -> list[ast.Call]:
    """The calls of ``x = torch.from_numpy(x).float().to(device)``: a blocking copy of host
    data (``torch.from_numpy``, ``torch.tensor``) to the device (the name is placed by this
    very move), which the host waits for, as it does for a load of weights. Not a copy with ``non_blocking=True``, nor one whose chain
    computes with a value placed elsewhere (``y = model(x).to(device)``)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return _moved_in_place(stmt.value, ctx)
    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
        return []
    move = stmt.value
    if call_name(move) not in {"to", "cuda"} or not _places(move, ctx):
        return []
    flag = keyword(move, "non_blocking")
    if flag is not None and not (isinstance(flag.value, ast.Constant) and not flag.value.value):
        return []
    assert isinstance(move.func, ast.Attribute)
    targets = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    if (names_in(move.func.value) & placed) - targets:
        return []
    calls = [sub for sub in walk(move) if isinstance(sub, ast.Call)]
    if (
        not any(ctx.call_qualname(sub) in _FROM_HOST for sub in calls)
        and not _host_name(move.func.value, ctx)
        and not _built_model(move.func.value, ctx)
    ):
        return []  # `inps = inps.to(dtype)`: nothing says the data is on the host
    return calls


def _moved_in_place(move: ast.Call, ctx: Context) -> list[ast.Call]:
    """``data.to(device, "x", "y")``, ``model.cuda()`` as a statement: an object moved in
    place, its host memory copied to the device, which the host waits for (not with
    ``non_blocking=True``; a move of what is there already does nothing)."""
    func = move.func
    if not (
        call_name(move) in {"to", "cuda"}
        and isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and _places(move, ctx)
        and keyword(move, "non_blocking") is None
    ):
        return []
    return [move]


def _built_model(node: ast.expr, ctx: Context) -> bool:
    """``get_model(name)`` or ``Net(...)`` moved as it is built (``model =
    get_model(args.model).to(device)``): its weights, made in host memory, are copied to the
    device, which the host waits for."""
    if not isinstance(node, ast.Call):
        return False
    name = (call_name(node) or "").lower()
    return file_facts(ctx).builds_module(node) or (
        "model" in name and name.startswith(("get_", "build_", "create_", "make_", "load_"))
    )


def _host_name(node: ast.expr, ctx: Context) -> bool:
    """``img = img.cuda()`` of a name the function made from host data above it (``img =
    torch.from_numpy(a).float().div(255.0)`` in YOLOv4's ``do_detect``): the same blocking
    copy as the one-statement chain, in two statements."""
    if not isinstance(node, ast.Name):
        return False
    fact = file_facts(ctx).fact(node, scope_node(ctx))
    return fact is not None and fact.where == "host"


# Tensors made from host data: their copy to the device starts from pageable host memory.
_FROM_HOST = frozenset({"torch.from_numpy", "torch.as_tensor", "torch.tensor", "torch.Tensor"}) | {
    # the legacy CPU constructors, open_lm's `texts = torch.LongTensor(texts).to(device)`
    f"torch.{kind}Tensor"
    for kind in ("Long", "Int", "Float", "Double", "Half", "Byte", "Bool")
}


def _periodic_calls(nodes: list[ast.AST]) -> set[int]:
    """The calls (by id) in branches taken every few steps, ``if step % eval_every == 0:``,
    that are not inside a loop of ``nodes`` and train nothing themselves: a wait there (an
    evaluation that reads its losses back) leaves the other steps' clock reads unsynchronized.
    Inside a loop of the region, such a wait still bounds how far the host runs ahead."""
    found: set[int] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, (*_LOOPS, *_DEFS)):
            continue
        if (
            isinstance(node, ast.If)
            and any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mod) for s in walk(node.test))
            and not branch_trains(node)
        ):
            found.update(
                id(sub) for stmt in node.body for sub in walk(stmt) if isinstance(sub, ast.Call)
            )
            todo.extend(node.orelse)
            continue
        todo.extend(children(node))
    return found


_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

Found = tuple[list[ast.AST], list[ast.stmt]]


def _until_read(block: list[ast.stmt], start: str, ctx: Context) -> Found | None:
    """The code that runs between the clock's start and its first read, in program order, and
    the statements after that read in its block.

    A loop whose body reads the clock first thing (``for batch in loader:
    data_time.update(time.time() - end)``) times only its header and the statements before
    that read on the first pass; later passes are timed from the loop's own restart of the
    clock. ``None`` when the block never reads the clock."""
    region: list[ast.AST] = []
    for position, stmt in enumerate(block):
        if not (_reads_elapsed(stmt, start) or _reads_clock(stmt, ctx)) or _another_timers(
            stmt, start, ctx
        ):
            region.append(stmt)
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor)) and not _reads_clock(stmt.iter, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.iter, *inner[0]], inner[1]
        elif isinstance(stmt, ast.While) and not _reads_clock(stmt.test, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.test, *inner[0]], inner[1]
        region.append(stmt)
        return region, block[position + 1 :]  # the stop: `end = time.time()` or `... - t0`
    return None


def _another_timers(stmt: ast.stmt, start: str, ctx: Context) -> bool:
    """``det_tic = time.time()`` inside the region of ``total_tic``: a clock read bound to a
    name the function subtracts only from, or only with, other names than ``start``
    (``det_toc - det_tic``): the start or the stop of a nested timer, not this one's stop."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id != start
        and isinstance(stmt.value, ast.Call)
        and _is_clock(stmt.value, ctx)
    ):
        return False
    partners = _subtractions(ctx).get(stmt.targets[0].id, set())
    return bool(partners) and start not in partners


def _subtractions(ctx: Context) -> dict[str, set[str]]:
    """Each name of the function (or module) that a subtraction of two names holds -> the
    names on the other side (``toc - tic``: ``toc`` -> {``tic``}, ``tic`` -> {``toc``})."""
    scope = ctx.function_scope() or ctx.scope.root()
    found: dict[str, set[str]] | None = scope.cache.get("tpl301-subtractions")
    if found is None:
        found = {}
        for sub in walk(scope.node):
            if (
                isinstance(sub, ast.BinOp)
                and isinstance(sub.op, ast.Sub)
                and isinstance(sub.left, ast.Name)
                and isinstance(sub.right, ast.Name)
            ):
                found.setdefault(sub.left.id, set()).add(sub.right.id)
                found.setdefault(sub.right.id, set()).add(sub.left.id)
        scope.cache["tpl301-subtractions"] = found
    return found


def _later_reads(rest: list[ast.stmt], start: str, ctx: Context) -> list[ast.AST]:
    """The statements up to the last read of the same start before the clock restarts:
    ``batch_time.update(time.time() - end)`` after ``data_time.update(time.time() - end)``
    times the whole step, from the same ``end``. A read of a stop taken before (``t1 =
    time.time()`` at the first read, then ``model(img)``, then ``print(t1 - t0)``) times what
    ran before that stop, not what runs after it."""
    taken: list[ast.AST] = []
    last = 0
    fresh: set[str] = set()  # names bound to a clock read after the first stop
    for stmt in rest:
        if _restarts(stmt, start, ctx):
            break
        taken.append(stmt)
        if _reads_elapsed(stmt, start, fresh, ctx):
            last = len(taken)
        if isinstance(stmt, ast.Assign) and _reads_clock(stmt.value, ctx):
            fresh |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return taken[:last]


def _restarts(stmt: ast.AST, start: str, ctx: Context) -> bool:
    """``end = time.time()``: the clock starts again under the same name."""
    return (
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == start for t in stmt.targets)
        and isinstance(stmt.value, ast.Call)
        and _is_clock(stmt.value, ctx)
    )


# What a diffusion pipeline's call hands back, decoded to images or frames on the host.
_DECODED = frozenset({"images", "frames"})


def _pipeline_outputs(region: list[ast.AST]) -> set[int]:
    """``pipe(prompt=p).images[0]``, ``pipe(...).frames[0]``: a diffusion pipeline's output,
    which it decodes and converts to PIL images or arrays on the host (unless asked for
    ``output_type="pt"`` or ``"latent"``), waiting for the device's work."""
    found: set[int] = set()
    for node in region:
        for sub in walk(node):
            if not (
                isinstance(sub, ast.Attribute)
                and sub.attr in _DECODED
                and isinstance(sub.value, ast.Call)
            ):
                continue
            kind = keyword(sub.value, "output_type")
            if kind is None or (
                isinstance(kind.value, ast.Constant) and kind.value.value in {"pil", "np"}
            ):
                found.add(id(sub.value))
    return found


# A whole run of steps (which reads results back as it goes: losses, each generated token for
# its stop check), or a load of weights, whose copies from host memory the host waits for.
_RUN_WORDS = (
    "train",
    "epoch",
    "evaluate",
    "fit",
    "validate",
    "generate",
    "load_checkpoint",
    "load_state",
    "load_weights",
    "load_model",
)


def _whole_run(call: ast.Call) -> bool:
    """``train_one_epoch(...)``, ``evaluate(...)``, ``generate(model, prompt)``: the clock times
    a whole run of steps, which read their results back as they go (a decoder reads each token
    to check for a stop); ``load_checkpoint(...)`` copies from host memory, which the host waits
    for. The total is wall time, not a kernel launch. A step (``train_step(batch)``) is not a
    run."""
    name = (call_name(call) or "").lower()
    if "step" in name or "batch" in name:
        return False  # `train_step(batch)`, `train_batch(x)`: one step's launches
    if _mode_switch(call):
        return False  # `model.train()`: sets a flag on the module, runs nothing
    return any(word in name for word in _RUN_WORDS)


def _mode_switch(call: ast.Call) -> bool:
    """``model.train()``, ``model.train(False)``, ``net.eval()``: a module's mode switch."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in {"train", "eval"}
        and not call.keywords
        and (
            not call.args
            or (len(call.args) == 1 and isinstance(call.args[0], (ast.Constant, ast.Name)))
        )
    )


def _runs_synced(call: ast.Call, ctx: Context) -> bool:
    """The call waits for the device: a function of the linted code (this file's, ``self.f``,
    or one imported from a module beside it) whose body certainly syncs (``x.cpu()``,
    ``torch.cuda.synchronize()``), or a run of steps or a load of weights by its name
    (:func:`_whole_run`), unless it is a function of the linted code whose body may not sync
    or read a value back anywhere (:func:`_body_syncs`): a project's own
    ``generate(model, idx, n)`` that never reads a token back runs asynchronously like any
    other launch."""
    found = _callees(call, file_facts(ctx), scope_node(ctx))
    memo: Memo = ctx.scope.root().cache.setdefault("tpl301-body-syncs", {})
    if any(_body_syncs(o, c, _absent(call, c), 0, memo, definite=True) for o, c in found):
        return True  # `custom_to_np(x)`, whose body runs `x.cpu()`
    if not _whole_run(call):
        return False
    return not found or any(_body_syncs(o, c, _absent(call, c), 0, memo) for o, c in found)


Callee = tuple[FileFacts, ast.FunctionDef | ast.AsyncFunctionDef]
# Answers of `_body_syncs` in a file, by function, parameters left at `None`, and `definite`.
Memo = dict[tuple[ast.AST, frozenset[str], bool], bool]


def _callees(call: ast.Call, facts: FileFacts, scope: ast.AST) -> list[Callee]:
    """The definitions of the linted code that ``call`` runs: ``f(...)`` (this file's ``f``
    or ``from module import f`` of a module file beside it), ``self.f(...)``, or a function
    of an imported module of the linted tree (``from tool import utils``, then
    ``utils.post_processing(img, output)``)."""
    func = call.func
    if isinstance(func, ast.Name):
        return facts.callees(func.id, facts.qualname(func))
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in facts.resolver.names
    ):
        qualname = facts.qualname(func)
        return facts.callees(func.attr, qualname) if qualname is not None else []
    method = facts.local_def(func, scope) if isinstance(func, ast.Attribute) else None
    if method is None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        method = _instance_method(func.value.id, func.attr, facts, scope)
    return [(facts, method)] if method is not None else []


def _instance_method(
    name: str, attr: str, facts: FileFacts, scope: ast.AST
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """``predictor.predict(task)`` with ``predictor = Predictor(cfg, device=device)``, the
    one binding of the name in the function, a class of this file: that class's own
    ``predict``."""
    values = [
        node.value
        for node in walk(scope)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    called = values[0].func
    cls = facts.top_level(called.id) if isinstance(called, ast.Name) else None
    if not isinstance(cls, ast.ClassDef):
        return None
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == attr:
            return item
    return None


def _absent(call: ast.Call, callee: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """The parameters of ``callee`` that ``call`` leaves at a ``None`` default."""
    if has_star_kwargs(call) or any(isinstance(arg, ast.Starred) for arg in call.args):
        return frozenset()
    args = callee.args
    positional = [*args.posonlyargs, *args.args]
    defaults = parameter_defaults(callee)
    names = [a.arg for a in positional]
    if names and names[0] in {"self", "cls"} and isinstance(call.func, ast.Attribute):
        names = names[1:]
    passed = set(names[: len(call.args)]) | {kw.arg for kw in call.keywords if kw.arg}
    return frozenset(
        name
        for name, default in defaults.items()
        if name not in passed and isinstance(default, ast.Constant) and default.value is None
    )


# Calls whose result has a data-dependent shape: the host waits for the values to size it.
_SHAPE_READS = frozenset({"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"})
# Calls that print, log or save what they are given (a tensor among it is copied to the host).
_OUTPUTS = frozenset(
    {
        "print",
        "info",
        "debug",
        "warning",
        "log",
        "log_dict",
        "write",
        "add_scalar",
        "set_postfix",
        "set_description",
        "save",
    }
)
# Calls in a test that give a host value whatever they are handed.
_HOST_TESTS = frozenset(
    {"isinstance", "hasattr", "callable", "len", "getattr", "type", "exists", "is_available"}
)
_MAX_DEPTH = 3


def _body_syncs(
    owner: FileFacts,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    absent: frozenset[str],
    depth: int,
    memo: Memo,
    *,
    definite: bool = False,
) -> bool:
    """Whether a call of ``function`` may make the host wait for the device: its body (or a
    function of the linted code it calls) synchronizes, reads a value back (``.item()``,
    ``.cpu()``, ``.tolist()``, ``float(x)``, a ``.to("cpu")``, a data-dependent shape),
    prints, logs or saves a computed value, tests a value that may be a tensor
    (``if token.item() == eos:``, ``if (token == eos_id).all():``), or runs something whose
    name says it is a whole run or a load (:func:`_whole_run`). A comparison with a parameter
    the call leaves at ``None`` (``if idx_next == eos_id:`` with no ``eos_id`` given) reads
    nothing: a tensor compared with ``None`` is ``False`` on the host. Unknown is "yes".

    With ``definite``, only what certainly waits counts (a synchronize, ``.item()``,
    ``.cpu()``, ``.tolist()``, ``.numpy()``, ``.to("cpu")``, a data-dependent shape, in
    the body or in a function of the linted code it calls), and unknown is "no"."""
    if depth > _MAX_DEPTH:
        return not definite
    key = (function, absent, definite)
    known = memo.get(key)
    if known is not None:
        return known
    memo[key] = not definite  # recursion: unknown
    params = {a.arg for a in walk(function.args) if isinstance(a, ast.arg)}
    result = False
    for sub in walk(function):
        if isinstance(sub, ast.Call):
            result = _call_syncs(sub, owner, function, depth, memo, definite)
        elif isinstance(sub, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            result = (
                _tests_torch_result(sub.test, owner)
                if definite
                else _may_read_test(sub.test, params, absent)
            )
        if result:
            break
    memo[key] = result
    return result


def _call_syncs(
    call: ast.Call,
    owner: FileFacts,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    depth: int,
    memo: Memo,
    definite: bool,
) -> bool:
    name = call_name(call)
    qualname = owner.qualname(call.func)
    values = [*call.args, *(kw.value for kw in call.keywords)]
    if name in SYNC_CALLS or name in _SHAPE_READS or name == "Event":
        return True
    if qualname is not None and "synchronize" in qualname:
        return True
    if name == "to" and any(_is_cpu(v) for v in values):
        return True
    if name is not None and _copies_to_host(name):
        return True
    if not definite:
        if name is not None and "sync" in name.lower():
            return True  # also `no_sync()`: unknown is "yes"
        if name in CASTS and any(not isinstance(v, ast.Constant) for v in values):
            return True
        if name in _OUTPUTS and any(not _literal(v) for v in values):
            return True
    found = _callees(call, owner, function)
    if not found:
        return not definite and _whole_run(call)
    return any(
        _body_syncs(other, callee, _absent(call, callee), depth + 1, memo, definite=definite)
        for other, callee in found
    )


def _literal(node: ast.expr) -> bool:
    """A constant, or an f-string with nothing formatted into it."""
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(part, ast.Constant) for part in node.values)
    return isinstance(node, ast.Constant)


# Torch functions whose result is a tensor a branch's test reads back (`if torch.isinf(norm):`).
_TENSOR_TESTS = frozenset({"isinf", "isnan", "isfinite", "any", "all"})


def _tests_torch_result(test: ast.expr, owner: FileFacts) -> bool:
    """A branch's test that certainly reads a tensor back: the truth of what a torch test
    function returns (``if torch.isinf(grad_norm):``, ``if not torch.isfinite(x).all():``),
    which waits for the device computing its operand."""
    if isinstance(test, ast.BoolOp):
        return any(_tests_torch_result(value, owner) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tests_torch_result(test.operand, owner)
    if not isinstance(test, ast.Call):
        return False
    func = test.func
    if isinstance(func, ast.Attribute) and func.attr in {"any", "all"} and not test.args:
        return _tests_torch_result(func.value, owner)  # torch.isnan(x).any()
    name = owner.qualname(func) or ""
    return name.startswith("torch.") and name.rsplit(".", 1)[-1] in _TENSOR_TESTS


def _may_read_test(test: ast.expr, params: set[str], absent: frozenset[str]) -> bool:
    """Whether a branch's test may convert a device tensor to a Python bool (a read back).
    Settings are not: a parameter used as a flag, an attribute (``x.is_cuda``,
    ``args.verbose``), ``is``/``in`` tests, comparisons with a string or ``None`` (or with a
    parameter the call leaves at ``None``), ``isinstance``, ``len`` and the like."""
    if isinstance(test, ast.BoolOp):
        return any(_may_read_test(value, params, absent) for value in test.values)
    if isinstance(test, ast.UnaryOp):
        return _may_read_test(test.operand, params, absent)
    if isinstance(test, (ast.Constant, ast.Attribute)):
        return False
    if isinstance(test, ast.Name):
        return test.id not in params
    if isinstance(test, ast.Call):
        return call_name(test) not in _HOST_TESTS
    if isinstance(test, ast.Compare):
        if all(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in test.ops):
            return False
        for side in [test.left, *test.comparators]:
            if isinstance(side, ast.Constant) and (
                side.value is None or isinstance(side.value, (str, bytes))
            ):
                return False
            if isinstance(side, ast.Name) and side.id in absent:
                return False
            if isinstance(side, ast.Call) and call_name(side) in _HOST_TESTS:
                return False
        return True
    return True


def _is_clock(call: ast.Call, ctx: Context) -> bool:
    return ctx.call_qualname(call) in TIMERS


def _reads_clock(stmt: ast.AST, ctx: Context) -> bool:
    return any(isinstance(sub, ast.Call) and _is_clock(sub, ctx) for sub in walk(stmt))


def _limits(stop: ast.AST, start: str) -> bool:
    """The first read compares the elapsed time with a limit (a time-out guard)."""
    return any(
        isinstance(sub, ast.Compare)
        and any(_reads_elapsed(side, start) for side in [sub.left, *sub.comparators])
        for sub in walk(stop)
    )


def _reads_elapsed(
    stmt: ast.AST, start: str, fresh: set[str] | None = None, ctx: Context | None = None
) -> bool:
    """``... - start`` in ``stmt``; given ``fresh`` (and ``ctx``), only a clock read there or
    one of the ``fresh`` names bound to a later one: ``time.time() - end``, ``t2 - t0``."""
    for sub in walk(stmt):
        if (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Sub)
            and isinstance(sub.right, ast.Name)
            and sub.right.id == start
            and (
                fresh is None
                or ctx is None
                or _reads_clock(sub.left, ctx)
                or (isinstance(sub.left, ast.Name) and sub.left.id in fresh)
            )
        ):
            return True
    return False


def _syncs(call: ast.Call, ctx: Context) -> bool:
    name = call_name(call)
    if name in SYNC_CALLS or name == "Event":
        return True
    if name is not None and "sync" in name.lower() and not _skips_sync(name):
        return True  # a project's own helper: sync(), device_sync(), time_sync()
    if name is not None and _copies_to_host(name):
        return True  # `to_python_float(loss)`, `tensor_to_numpy(x)`: a read back
    if name == "to" and copies_to_cpu(call, ctx):
        return True  # `model.to("cpu", dtype)`: a blocking copy back, as `.cpu()` is
    qualname = ctx.call_qualname(call)
    if qualname == "torch.save":
        return True  # serialising copies every device tensor it is given to host memory
    if name == "step" and _grad_scaler(call.func, ctx):
        return True  # `scaler.step(optimizer)` reads `found_inf` back with `.item()`
    return qualname is not None and "synchronize" in qualname


def _grad_scaler(func: ast.expr, ctx: Context) -> bool:
    """``scaler`` of ``scaler.step(optimizer)``, a name the function (or the module) binds to
    one of torch's ``GradScaler``s, whose ``step`` reads back whether the gradients hold an
    inf."""
    if not isinstance(func, ast.Attribute):
        return False
    name = dotted_name(func.value)
    scopes = [s for s in (ctx.function_scope(), ctx.scope.root()) if s is not None]
    return name is not None and any(
        isinstance(value, ast.Call) and _names_grad_scaler(ctx.call_qualname(value) or "")
        for scope in scopes
        for value in ctx.scope_bindings(scope).get(name) or []
    )


# What a helper named `..._to_<word>` hands back: a host value, copied from the device.
_HOST_WORDS = frozenset({"python", "numpy", "np", "cpu", "host", "list", "float", "int"})


def _copies_to_host(name: str) -> bool:
    """``to_python_float``, ``tensor_to_numpy``, ``custom_to_np``, ``move_to_cpu``: a helper
    whose name says it converts to a host value (``to_npu`` moves to a device)."""
    words = name.lower().split("_")
    return any(word == "to" and after in _HOST_WORDS for word, after in pairwise(words))


def _skips_sync(name: str) -> bool:
    """``model.no_sync()``, ``fabric.no_backward_sync(model)``: a context that skips the
    gradients' all-reduce for a step; it does not wait for the device."""
    return name.lower().startswith("no_")


_NO_VALUE_TESTS = (ast.Is, ast.IsNot, ast.In, ast.NotIn)


def _tests_placed(node: ast.AST, placed: set[str]) -> bool:
    """``if has_data < args.world_size: break`` with ``has_data`` a placed tensor (open_lm's
    end-of-data check after an ``all_reduce``): the test converts the comparison with
    ``bool()``, a read back that waits for the device's queued work. Identity and membership
    tests (``if x is None:``) compare no values."""
    return any(
        isinstance(sub, (ast.If, ast.While))
        and isinstance(sub.test, ast.Compare)
        and not any(isinstance(op, _NO_VALUE_TESTS) for op in sub.test.ops)
        and any(
            isinstance(side, ast.Name) and side.id in placed
            for side in (sub.test.left, *sub.test.comparators)
        )
        for sub in walk(node)
    )


def _sized_by_values(node: ast.AST, placed: set[str]) -> bool:
    """``out[mask > 0]``, ``torch.nonzero(scores > t)`` of a placed tensor: a result whose
    shape depends on the values, which the host waits for to size it."""

    def on_device(sub: ast.AST) -> bool:
        return any(
            (isinstance(n, ast.Name) and n.id in placed)
            or (isinstance(n, ast.Call) and call_name(n) in {"cuda", "to"})
            for n in walk(sub)
        )

    for sub in walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Compare):
            if not any(isinstance(op, _NO_VALUE_TESTS) for op in sub.slice.ops) and on_device(sub):
                return True
        elif isinstance(sub, ast.Call) and call_name(sub) in _SHAPE_READS and on_device(sub):
            return True
    return False


def _reads_back(call: ast.Call, placed: set[str], ctx: Context) -> bool:
    """``int(pred[0] == labels[i])``, ``float(loss)``: a cast of a value computed from a placed
    tensor copies it to the host, which waits for the device's queued work."""
    func = call.func
    if any(_formats(arg, placed, ctx) for arg in call.args):
        return True
    if not (isinstance(func, ast.Name) and func.id in CASTS and len(call.args) == 1):
        return False
    return any(isinstance(n, ast.Name) and n.id in placed for n in walk(call.args[0]))


def _formats(node: ast.expr, placed: set[str], ctx: Context) -> bool:
    """``print("Cost: %.4f" % cost)``, ``f"{loss:.3f}"``, ``"{}".format(acc)`` of a value
    computed from a placed tensor: formatting it converts it to text on the host, which waits
    for the device's queued work (a training loop that prints its cost every 50 batches)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        if not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)):
            return False
        values: list[ast.expr] = [node.right]
    elif isinstance(node, ast.JoinedStr):
        values = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
    ):
        values = [*node.args, *(kw.value for kw in node.keywords)]
    else:
        return False
    scope = scope_node(ctx)
    return any(
        n.id in placed or ((fact := file_facts(ctx).fact(n, scope)) is not None and fact.on_device)
        for v in values
        for n in walk(v)
        if isinstance(n, ast.Name)
    )


def _uses(call: ast.Call, placed: set[str], ctx: Context) -> bool:
    """The call computes with a tensor or module this function put on an accelerator:
    ``model(x)``, ``fn(x)``, ``torch.mm(x, w)`` or ``x.matmul(w)``, with ``x``/``model``
    placed. (``helper.prepare(model)`` and other methods of unplaced objects may well be
    host work: silent.)"""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in placed:
            return True
        operands: list[ast.AST] = [*call.args, *(kw.value for kw in call.keywords)]
    elif isinstance(func, ast.Attribute):
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in placed:
            return func.attr not in _METADATA_METHODS
        if func.attr == "backward" and isinstance(root, ast.Name):
            return _computed_from(root.id, placed, ctx)  # `outputs.loss.backward()`
        name = ctx.qualname(func)
        operands = [*call.args, *(kw.value for kw in call.keywords)]
        if name is None and _names_model(root) and func.attr not in _METADATA_METHODS:
            # `vq_model.decode_code(index_sample, shape)`: a model's method run on a tensor
            # this function placed (the model may come from a loader it cannot see)
            return any(n.id in placed for op in operands for n in _operand_names(op))
        if name is None and _own_object(func, ctx):
            # `self.gpt(codes, torch.tensor([n], device=codes.device))`: an object the class
            # built in `__init__` run on a placed tensor, or on one the call itself places
            return any(
                _placed_here(op, ctx) or any(n.id in placed for n in _operand_names(op))
                for op in operands
            )
        if name is None or not name.startswith("torch.") or name.startswith("torch.cuda."):
            return False
    else:
        return False
    return any(n.id in placed for op in operands for n in _operand_names(op))


def _placed_here(node: ast.AST, ctx: Context) -> bool:
    """``x.to(device)``, ``torch.tensor([n], device=x.device)``: an argument the call's own
    expression puts on the device."""
    return isinstance(node, ast.Call) and _places(_settled(node), ctx)


def _own_object(func: ast.Attribute, ctx: Context) -> bool:
    """``self.gpt`` of ``self.gpt(...)``, where the class's ``__init__`` binds ``self.gpt`` to
    an object it builds (``self.gpt = UnifiedVoice(**cfg)``), not a method of the class."""
    scope = ctx.function_scope()
    cls = scope.cls if scope is not None else None
    if not (cls is not None and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return False
    for item in getattr(cls.node, "body", []):
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return any(
                isinstance(sub, ast.Assign)
                and isinstance(sub.value, ast.Call)
                and any(dotted_name(t) == f"self.{func.attr}" for t in sub.targets)
                for sub in walk(item)
            )
    return False


def _computed_from(name: str, placed: set[str], ctx: Context) -> bool:
    """``name`` is bound in the function to a value computed with a placed name (``outputs =
    model(x)`` with ``model`` moved): a backward pass from it runs on the device."""
    scope = ctx.function_scope()
    if scope is None:
        return False
    return any(
        isinstance(sub, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in sub.targets)
        and any(isinstance(n, ast.Name) and n.id in placed for n in walk(sub.value))
        for sub in walk(scope.node)
    )


_MODEL_WORDS = frozenset({"model", "net", "vae", "unet", "encoder", "decoder", "generator"})


def _names_model(node: ast.expr) -> bool:
    """A name for a model by its last word (``vq_model``, ``net``, ``G_net``, ``vae``)."""
    return isinstance(node, ast.Name) and node.id.lower().rsplit("_", 1)[-1] in _MODEL_WORDS


def _operand_names(node: ast.AST) -> list[ast.Name]:
    """The names an operand computes with, less those it only reads metadata of
    (``y[0].shape``, ``x.size(0)``, ``x.dtype``)."""
    if isinstance(node, ast.Attribute) and node.attr in _METADATA_ATTRS:
        return []
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _METADATA_METHODS
    ):
        return []
    if isinstance(node, ast.Name):
        return [node]
    return [n for child in children(node) for n in _operand_names(child)]


def _device_names(scope: Scope, ctx: Context, line: int) -> set[str]:
    """Names this function binds to something it placed on an accelerator.

    ``x = x.cuda()``, ``x = batch.to("cuda:0")``, ``y = torch.ones(3, device="cuda")``, what a
    call is told to build on or move to a device variable (``y = torch.ones(3, device=device)``,
    ``batch = task.prepare_batch(batch, device=device)``), modules moved in place
    (``model.cuda()``, ``model.to(device)`` as a statement), what a Lightning ``Fabric`` on an
    accelerator sets up or builds before ``line`` (:func:`_fabric_names`), and the parameters
    that a call of this function in its file hands a placed value (:func:`_placed_params`).
    """
    key = f"device-names:{line}"
    cached: set[str] | None = scope.cache.get(key)
    if cached is not None:
        return cached
    names = _placed_in(scope.node, ctx, 0, line)
    scope.cache[key] = names
    return names


_CALLER_DEPTH = 2


def _placed_in(node: ast.AST, ctx: Context, depth: int, line: int) -> set[str]:
    """The placed names of a function (all of its nodes) or, for a caller at module level, of
    the module's own statements (not its functions)."""
    names: set[str] = set()
    nodes = _top_level(node) if depth and isinstance(node, ast.Module) else list(walk(node))
    for sub in nodes:
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
            if _places(_settled(sub.value), ctx):
                names.update(t.id for t in sub.targets if isinstance(t, ast.Name))
                # `batch[k] = batch[k].to(device)`: each entry replaced by its move
                names.update(
                    held.id
                    for t in sub.targets
                    if isinstance(held := moved_in_place(t, sub.value), ast.Name)
                )
        elif isinstance(sub, ast.Expr) and isinstance(sub.value, ast.Call):
            call = _settled(sub.value)
            if (
                _places(call, ctx, told=False)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
            ):
                names.add(call.func.value.id)
    names |= _fabric_names(nodes, ctx, line)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and depth < _CALLER_DEPTH:
        names |= _placed_params(node, ctx, depth)
    return names


def _settled(call: ast.Call) -> ast.Call:
    """The move under the mode and dtype settings a chain ends with: ``model.to(device)`` of
    ``model = model.to(device).eval()`` (also as a statement, ``model.cuda().half()``)."""
    while (
        isinstance(call.func, ast.Attribute)
        and call.func.attr in _SETTINGS
        and isinstance(call.func.value, ast.Call)
        and call_name(call.func.value) in {"to", "cuda", *_SETTINGS}
    ):
        call = call.func.value
    return call


# Module methods that set a mode or a dtype and hand the module back where it is.
_SETTINGS = frozenset({"eval", "train", "half", "float", "bfloat16", "requires_grad_"})


def _placed_params(
    function: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context, depth: int
) -> set[str]:
    """The parameters of ``function`` that a call of it in the same file hands a placed value:
    ``train(fabric, model, ...)`` from a ``main`` that set ``model`` up on the device. A value
    counts as placed when the provenance says it is on a device, or when the caller binds it
    as this rule sees placements (:func:`_placed_in`, which follows the caller's own callers)."""
    facts = file_facts(ctx)
    found: set[str] = set()
    for caller, call, _loops in facts.calls_of(function.name):
        if caller is function or facts.local_def(call.func, caller) is not function:
            continue
        optimizers = {
            param for param, arg in _bound_args(call, function) if _an_optimizer(arg, caller, facts)
        }
        found.update(
            param
            for param, fact in facts.arg_facts(call, function, caller).items()
            if fact.on_device and param not in optimizers
        )
        placed = _placed_in(caller, ctx, depth + 1, call.lineno)
        for param, arg in _bound_args(call, function):
            if isinstance(arg, ast.Name) and arg.id in placed:
                found.add(param)
    return found


def _an_optimizer(arg: ast.expr, caller: ast.AST, facts: FileFacts) -> bool:
    """``arg`` is a name the caller binds only to a ``torch.optim`` optimizer: it holds the
    model's parameters, yet handing it on (``get_learning_rate(optimizer)`` reads its
    ``param_groups``) computes nothing on the device; its own ``step()`` runs after a
    ``backward()`` that is the device work."""
    if not isinstance(arg, ast.Name):
        return False
    values = bindings(caller).get(arg.id) or [None]
    return all(
        isinstance(value, ast.Call)
        and (facts.qualname(value.func) or "").startswith("torch.optim.")
        for value in values
    )


def _bound_args(
    call: ast.Call, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> list[tuple[str, ast.expr]]:
    """The arguments of ``call`` by the parameter of ``function`` they bind (``self`` is the
    receiver of ``self.f(...)``)."""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params and params[0] in {"self", "cls"} and isinstance(call.func, ast.Attribute):
        params = params[1:]
    bound: list[tuple[str, ast.expr]] = []
    for param, arg in zip(params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        bound.append((param, arg))
    bound.extend((kw.arg, kw.value) for kw in call.keywords if kw.arg is not None)
    return bound


# Lightning Fabric: the methods that put modules, optimizers or tensors on its device, and the
# context manager that builds modules there.
_FABRIC_PLACES = frozenset({"setup", "setup_module", "to_device"})
_FABRIC_BUILDS = frozenset({"init_module"})
# The accelerators that put the work on a device (``"auto"``, the default, picks the GPU when
# there is one: the code is written for it).
_FABRIC_ACCELERATORS = frozenset({"cuda", "gpu", "mps", "auto"})


def _fabric_names(nodes: list[ast.AST], ctx: Context, line: int) -> set[str]:
    """What a Lightning ``Fabric`` on an accelerator places in ``nodes`` before ``line`` (a move
    after the clock's start, ``model = fabric.to_device(model)`` once the model is sharded on
    the host, leaves the timed setup on the host): the results of
    ``fabric.setup(model, optimizer)``, ``fabric.setup_module(model)`` and
    ``fabric.to_device(batch)`` (not with ``move_to_device=False``), and what is built under
    ``with fabric.init_module():`` (not with ``torch.device("meta")`` beside it).
    ``fabric`` is bound to ``Fabric(...)`` (``lightning.Fabric``, ``lightning.fabric.Fabric``)
    in the same function or at module level, with no ``accelerator=`` or a constant that names
    an accelerator; ``accelerator="cpu"``, a computed one or ``**kwargs`` keep it silent."""
    root = ctx.scope.root()
    module: set[str] | None = root.cache.get("tpl301-module-fabrics")
    if module is None:
        module = root.cache["tpl301-module-fabrics"] = _gpu_fabrics(_top_level(root.node), ctx)
    fabrics = _gpu_fabrics(nodes, ctx) | module
    if not fabrics:
        return set()
    names: set[str] = set()
    for sub in nodes:
        if getattr(sub, "lineno", line) >= line:
            continue
        if (
            isinstance(sub, ast.Assign)
            and _fabric_call(sub.value, fabrics, _FABRIC_PLACES)
            and not _kept_off(sub.value)
        ):
            names.update(n for target in sub.targets for n in names_in(target))
        elif (
            isinstance(sub, (ast.With, ast.AsyncWith))
            and any(_fabric_call(i.context_expr, fabrics, _FABRIC_BUILDS) for i in sub.items)
            and not any(_kept_off(i.context_expr) for i in sub.items)
        ):
            for stmt in sub.body:
                for inner in walk(stmt):
                    if isinstance(inner, ast.Assign) and isinstance(inner.value, ast.Call):
                        names.update(t.id for t in inner.targets if isinstance(t, ast.Name))
    return names


def _kept_off(node: ast.expr) -> bool:
    """``fabric.setup_module(model, move_to_device=False)``, or a ``with`` that also enters
    ``torch.device("meta")`` (which wins): nothing lands on the accelerator."""
    if not isinstance(node, ast.Call):
        return False
    move = getattr(keyword(node, "move_to_device"), "value", None)
    if isinstance(move, ast.Constant) and move.value is False:
        return True
    return call_name(node) == "device" and not (
        node.args and is_device_expr(node.args[0]) and not _is_cpu(node.args[0])
    )


def _fabric_call(node: ast.expr, fabrics: set[str], methods: frozenset[str]) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in methods
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in fabrics
    )


def _gpu_fabrics(nodes: list[ast.AST], ctx: Context) -> set[str]:
    """Names bound to a ``Fabric`` on an accelerator by assignments among ``nodes``."""
    return {
        target.id
        for sub in nodes
        if isinstance(sub, ast.Assign)
        and isinstance(sub.value, ast.Call)
        and _gpu_fabric(sub.value, ctx)
        for target in sub.targets
        if isinstance(target, ast.Name)
    }


def _top_level(node: ast.AST) -> list[ast.AST]:
    """The nodes of a module's own statements, not of its functions and classes."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(getattr(node, "body", []))
    while todo:
        sub = todo.pop()
        if isinstance(sub, _DEFS):
            continue
        found.append(sub)
        todo.extend(children(sub))
    return found


def _gpu_fabric(call: ast.Call, ctx: Context) -> bool:
    """``L.Fabric(accelerator="cuda", ...)``, ``Fabric(devices=1)``: a Lightning Fabric whose
    accelerator is a device (or the default, ``"auto"``)."""
    if call_name(call) != "Fabric" or has_star_kwargs(call) or call.args:
        return False
    qualname = ctx.call_qualname(call)
    if qualname is None or qualname.split(".")[0] not in {"lightning", "lightning_fabric"}:
        return False
    accelerator = getattr(keyword(call, "accelerator"), "value", None)
    if accelerator is None:
        return True
    return isinstance(accelerator, ast.Constant) and accelerator.value in _FABRIC_ACCELERATORS


def _places(call: ast.Call, ctx: Context, *, told: bool = True) -> bool:
    """A move (``.cuda()``, ``.to(device)``), a call given an accelerator (``device="cuda"``),
    or, with ``told``, one given a device variable (``device=device``) to build or put its
    result on (as a statement, ``model.set_cache(device=d)`` does not move ``model``)."""
    name = call_name(call)
    if name == "cuda":
        return True
    if name == "to" and moves_to_device(call, ctx):
        first = call.args[0] if call.args else None
        return not (isinstance(first, ast.Constant) and first.value == "cpu")
    device = getattr(keyword(call, "device"), "value", None)
    if isinstance(device, ast.Constant):
        return isinstance(device.value, str) and DEVICE_STRING.fullmatch(device.value) is not None
    if (  # `to_device(batch, self.device)`: the project's transfer helper, handed the device
        told and device is None and name is not None and _device_helper(name.lstrip("_"), call.args)
    ):
        device = next((a for a in call.args[1:] if is_device_expr(a)), None)
    if not told or device is None or _is_cpu(device):
        return False
    return is_device_expr(device) or _device_of(device)


def _device_of(node: ast.expr) -> bool:
    """Where something lives, by a computed expression: ``next(net.parameters()).device``, or
    a helper named for a device, ``get_net_device(net)``: built where the model runs, as
    ``device=device`` is."""
    if isinstance(node, ast.Attribute):
        return node.attr == "device" and any(
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in {"parameters", "buffers"}
            for sub in walk(node.value)
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and "device" in node.func.id.lower()
    )


FAMILY = Family(
    rules=(UNSYNCED_TIMING,),
    checks=((ast.Assign, _assign, (UNSYNCED_TIMING.code,)),),
    triggers=(),
)
