"""TPL4xx: checkpoints and model loading (where a load lands, what it may run, when it runs)."""

from __future__ import annotations

import ast
import itertools
import os
import re

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    bindings,
    call_name,
    has_star_kwargs,
    keyword,
    loop_items,
    names_in,
)
from torchplace.lint.finding import Edit, Fix
from torchplace.lint.nodes import assigned, kept, own_nodes, parameter_defaults, walk
from torchplace.lint.provenance import FileFacts, facts_for_file, file_facts
from torchplace.lint.provenance.callers import _siblings, _text_of, call_sites
from torchplace.lint.provenance.flow import _keeps_storage
from torchplace.lint.provenance.values import _is_cpu
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import (
    file_names_no_device,
    in_test,
    loop_bound_names,
    only_used_by,
    receiver_root,
)
from torchplace.lint.rules.model_loads import (
    LOADERS,
    Load,
    call_targets,
    in_tree,
    is_loader,
    load_behind,
    not_loaded_yet,
    read_as_arrays,
)
from torchplace.lint.rules.model_saves import saved_paths

__all__ = ["FAMILY"]

NO_MAP_LOCATION = Rule("TPL401", "load-without-map-location", "`torch.load` without `map_location`")
NO_WEIGHTS_ONLY = Rule(
    "TPL402",
    "load-without-weights-only",
    "`torch.load` or a hub download without `weights_only=True`",
    "safe",
)
LOAD_PER_REQUEST = Rule(
    "TPL403", "load-in-loop-or-handler", "model loaded inside a request handler or a loop"
)

_ROUTE_DECORATORS = frozenset(
    {"get", "post", "put", "patch", "delete", "route", "api_route", "websocket", "endpoint"}
)
_HANDLER_METHODS = frozenset({"do_GET", "do_POST", "do_PUT", "do_PATCH", "do_DELETE"})
_LITAPI_METHODS = frozenset({"decode_request", "predict", "encode_response", "batch", "unbatch"})
# Serving frameworks whose subclasses' methods answer requests: (package, base class, methods).
_SERVING_BASES = (
    ("litserve", "LitAPI", _LITAPI_METHODS),
    ("cog", "Predictor", frozenset({"predict"})),  # `BasePredictor`, and the old `Predictor`
)
# Words of a handler's name that make loading its job.
_LOAD_WORDS = frozenset({"load", "reload", "loader"})
# A handler named for choosing a model (`change_gpt_weights`, `switch_model`): loading the
# chosen one is its job, as a "load" button's is.
_CHOOSE_WORDS = frozenset({"change", "switch", "select", "set", "use"})
_MODEL_NOUNS = frozenset({"model", "weights", "ckpt", "checkpoint", "lora", "vae"})
# Gradio calls that register an event handler (its `fn`, or first argument).
_GRADIO_EVENTS = frozenset({"click", "submit", "change", "upload", "select"})
_GRADIO_APPS = frozenset({"Interface", "ChatInterface"})


# Downloads that unpickle what they fetch with `torch.load(..., weights_only=False)` unless told
# otherwise: their default is False on every torch version.
_HUB_LOADS = frozenset(
    {
        "torch.hub.load_state_dict_from_url",
        "torch.utils.model_zoo.load_url",
        "torchvision.models.utils.load_state_dict_from_url",
        "torchvision._internally_replaced_utils.load_state_dict_from_url",
    }
)


def _reexported_model_zoo(name: str) -> bool:
    """``model_zoo.load_url`` with ``from torchvision.models.resnet import model_zoo``: older
    torchvision modules re-export ``torch.utils.model_zoo``."""
    return name.startswith("torchvision.models.") and name.endswith(".model_zoo.load_url")


def _call(call: ast.Call, ctx: Context) -> None:
    name = ctx.call_qualname(call)
    if name == "torch.load":
        _torch_load(call, ctx)
    elif name is not None and (name in _HUB_LOADS or _reexported_model_zoo(name)):
        _hub_load(call, ctx, ctx.segment(call.func) or name)
    if name in LOADERS:
        _load_site(call, ctx, name)
    elif isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained":
        _load_site(call, ctx, ctx.segment(call.func) or "from_pretrained")


def _loading_call(stmt: ast.Assign | ast.AnnAssign | ast.Expr, ctx: Context) -> None:
    """``helper = FaceHelper(...)`` in a handler or a loop, where the project's class loads
    weights in its constructor (or a project function loads them when called)."""
    call = stmt.value
    if not isinstance(call, ast.Call) or (not ctx.loops() and _request_handler(ctx) is None):
        return
    if is_loader(call, ctx.call_qualname(call)) is not None:
        return  # a loader itself: `_call` reports it
    load = _load_behind(call, ctx)
    if load is not None:
        _load_site(call, ctx, ctx.segment(call.func) or "...", via=load)


def _torch_load(call: ast.Call, ctx: Context) -> None:
    if has_star_kwargs(call):
        if keyword(call, "weights_only") is not None:
            return
        if _callers_leave_out(call, ctx, "weights_only"):
            # a caller's `pickle_module=` reaches the load through the `**kwargs` too
            unpickler = not _callers_leave_out(call, ctx, "pickle_module")
            _report_weights_only(call, ctx, forwarded=True, unpickler=unpickler)
            return
        keys = _local_mapping_keys(call, ctx)
        if keys is not None and "weights_only" not in keys:
            _report_weights_only(call, ctx, forwarded=False, unpickler="pickle_module" in keys)
        return
    if (
        len(call.args) < 2
        and _no_map_location(call, ctx)
        and not in_test(ctx)
        and not _in_dataset(ctx)
        and not _round_trip(call, ctx, wrapped=True, script=True)
        and not _saved_above_by_name(call, ctx)
        and not _host_only_payload(call, ctx)
        and not _loads_dataset(call, ctx)
        and not _saved_from_host(call, ctx)
        and not _host_cache(call, ctx)
        and _may_load_elsewhere(ctx)
        and not _cuda_only_branch(call, ctx)
        and not _saved_by_call(call, ctx)
        and not _saved_by_callers(call, ctx)
    ):
        ctx.report(
            NO_MAP_LOCATION.code,
            call,
            "`torch.load` without `map_location`: tensors return to the device they were saved "
            'from, which may not exist here; pass `map_location=` (e.g. "cpu" or the target '
            "device)",
        )
    if keyword(call, "weights_only") is None:
        _report_weights_only(call, ctx, forwarded=False)


# Methods that change a mapping in place: a `**mapping` bound to a display may then hold more.
_MAPPING_WRITES = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


def _local_mapping_keys(call: ast.Call, ctx: Context) -> set[str] | None:
    """The keys the ``**`` mappings of ``call`` hold, when each is a name its function binds only
    to dict displays of string keys and never changes in place (skorch's ``load_kwargs =
    {"map_location": map_location}``, then ``torch.load(f, **load_kwargs)``); None when any may
    hold more (a parameter, a mapping built elsewhere, updated, or handed to another call
    itself, not unpacked with ``**``)."""
    scope = ctx.function_scope()
    if scope is None:
        return None
    fn = scope.node
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    names = set()
    for kw in call.keywords:
        if kw.arg is None:
            if not isinstance(kw.value, ast.Name):
                return None
            names.add(kw.value.id)
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    params |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    if names & params:
        return None
    keys: set[str] = set()
    displays = stores = 0
    for node in walk(fn):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and names & set(node.names):
            return None
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                found = _display_keys(node.value)
                if found is None:
                    return None
                keys |= found
                displays += 1
        elif isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Store):
            stores += 1
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id in names and not isinstance(node.ctx, ast.Load):
                return None
        elif isinstance(node, ast.Call) and node is not call:
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in names
                and func.attr in _MAPPING_WRITES
            ):
                return None
            # `g(**kwargs)` unpacks a copy: `g` cannot add a key to the mapping itself
            handed = [*node.args, *(kw.value for kw in node.keywords if kw.arg is not None)]
            if any(isinstance(a, ast.Name) and a.id in names for a in handed):
                return None
    # every store of the names is a display's target: any other, a loop target or an
    # unpacking, may bind a mapping with more keys
    return keys if displays == stores > 0 else None


def _display_keys(value: ast.expr | None) -> set[str] | None:
    """The keys of a dict display of string keys (``{"map_location": "cpu"}``), or of a
    ``dict(...)`` call of keywords only (``dict(map_location="cpu")``); None for anything else."""
    if isinstance(value, ast.Dict):
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys):
            return None
        return {
            k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
        and all(kw.arg is not None for kw in value.keywords)
    ):
        return {kw.arg for kw in value.keywords if kw.arg is not None}
    return None


def _callers_leave_out(call: ast.Call, ctx: Context, name: str) -> bool:
    """``def load(path, **kwargs): return torch.load(path, **kwargs)``: the enclosing
    module-level function forwards its ``**kwargs`` to the load, it is called (in its file or
    a sibling module), and no call passes ``name`` (nor ``**`` of its own)."""
    scope = ctx.function_scope()
    if scope is None or scope.parent is None or scope.parent.kind != "module":
        return False
    node = scope.node
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    kwarg = node.args.kwarg
    star = [kw.value for kw in call.keywords if kw.arg is None]
    if kwarg is None or not all(isinstance(v, ast.Name) and v.id == kwarg.arg for v in star):
        return False
    sites = call_sites(file_facts(ctx), node)
    return bool(sites) and not any(
        kw.arg is None or kw.arg == name for site in sites for kw in site.keywords
    )


def _no_map_location(call: ast.Call, ctx: Context) -> bool:
    """No ``map_location=``, or one that is ``None``: given so, or a parameter of the
    enclosing module-level function that defaults to ``None`` and that none of its calls
    passes (LaMa's ``def load_url(url, model_dir, map_location=None)``, called without it)."""
    given = keyword(call, "map_location")
    if given is None:
        return True
    value = given.value
    if isinstance(value, ast.Constant):
        return value.value is None
    scope = ctx.function_scope()
    if not isinstance(value, ast.Name) or scope is None or scope.parent is None:
        return False
    node = scope.node
    if scope.parent.kind != "module" or not isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        return False
    default = parameter_defaults(node).get(value.id)
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if not (isinstance(default, ast.Constant) and default.value is None) or value.id not in names:
        return False
    index = names.index(value.id)
    sites = call_sites(file_facts(ctx), node)
    return bool(sites) and not any(
        len(site.args) > index
        or any(isinstance(a, ast.Starred) for a in site.args)
        or any(kw.arg is None or kw.arg == value.id for kw in site.keywords)
        for site in sites
    )


def _report_weights_only(
    call: ast.Call, ctx: Context, *, forwarded: bool, unpickler: bool = False
) -> None:
    if (
        not any(isinstance(arg, ast.Starred) for arg in call.args)
        and not in_test(ctx)
        and not _round_trip(call, ctx)
        and not _decided_elsewhere(ctx)
        and not _version_branch(call, ctx)
    ):
        if unpickler or _custom_unpickler(call):
            ctx.report(
                NO_WEIGHTS_ONLY.code,
                call,
                "`torch.load` with a `pickle_module` of its own unpickles arbitrary objects "
                "(code execution on a crafted file) on every torch version, and torch refuses "
                "`weights_only=True` with one; load only files you trust, or save a plain "
                "state dict and load it with `weights_only=True`",
            )
            return
        fix = _weights_only_fix(call, ctx)
        callers = " (no caller passes it through `**kwargs`)" if forwarded else ""
        ctx.report(
            NO_WEIGHTS_ONLY.code,
            call,
            "`torch.load` without `weights_only=True`" + callers + " unpickles arbitrary "
            "objects (code execution on a crafted file) on torch < 2.6; pass "
            "`weights_only=True`",
            fix,
        )


def _hub_load(call: ast.Call, ctx: Context, name: str) -> None:
    """``load_state_dict_from_url(url)``: the download is unpickled with ``weights_only=False``
    (the default of these functions on every torch version, unlike ``torch.load``'s). A
    ``**mapping`` counts when it is a local dict display without that key (as for
    ``torch.load``)."""
    if has_star_kwargs(call):
        keys = _local_mapping_keys(call, ctx)
        if keys is None or "weights_only" in keys:
            return
    if (
        keyword(call, "weights_only") is not None
        or any(isinstance(arg, ast.Starred) for arg in call.args)
        or len(call.args) >= 7  # weights_only given by position
        or in_test(ctx)
        or _decided_elsewhere(ctx)
        or _version_branch(call, ctx)
    ):
        return
    ctx.report(
        NO_WEIGHTS_ONLY.code,
        call,
        f"`{name}` without `weights_only=True` unpickles the file it downloads with "
        "`weights_only=False`, its default on every torch version (code execution on a "
        "crafted file); pass `weights_only=True`",
        _weights_only_fix(call, ctx),
    )


def _weights_only_fix(call: ast.Call, ctx: Context) -> Fix | None:
    """``weights_only=True`` added after the call's last argument (None where that place
    cannot be found)."""
    where = _after_last_argument(call, ctx)
    if where is None:
        return None
    line, col = where
    return Fix("add `weights_only=True`", (Edit(line, col, line, col, ", weights_only=True"),))


def _custom_unpickler(call: ast.Call) -> bool:
    """``torch.load(f, pickle_module=dill)`` (or a third positional argument): torch refuses
    ``weights_only=True`` with a pickle module of the caller's, so adding it breaks the load."""
    return len(call.args) >= 3 or keyword(call, "pickle_module") is not None


def _after_last_argument(call: ast.Call, ctx: Context) -> tuple[int, int] | None:
    """Where ``, weights_only=True`` goes: after the last argument and the parentheses around
    it (``torch.load((path))``), as (line, byte column); None when the call has no argument or
    its text is not what the tree says."""
    last = max(
        [*call.args, *(kw.value for kw in call.keywords)],
        key=lambda node: (node.end_lineno or 0, node.end_col_offset or 0),
        default=None,
    )
    if last is None or last.end_lineno is None or last.end_col_offset is None:
        return None
    if call.end_lineno is None or call.end_col_offset is None:
        return None
    lines = ctx.lines()
    stop = (call.end_lineno, call.end_col_offset - 1)  # the call's own closing parenthesis
    here = (last.end_lineno, last.end_col_offset)
    if here > stop:
        return None  # a generator argument's span takes in the call's parentheses
    where = here
    while here < stop:
        line, col = here
        if line > len(lines):
            return None
        text = lines[line - 1].encode("utf-8")
        if col >= len(text) or text[col : col + 1] in (b"#", b"\\"):
            here = (line + 1, 0)  # the rest of the line is a comment or a line break
            continue
        char = text[col : col + 1]
        if char == b")":
            where = (line, col + 1)  # closes a parenthesis around the argument
        elif char == b",":
            break
        elif not char.isspace():
            return None
        here = (line, col + 1)
    return where


_HOST_PAYLOADS = (
    "rng",
    "random_state",
    "schedul",  # scheduler, schedule
    "metadata",
    "meta_",
    "_meta",
    "vocab",
    "config",
)


# A file named for a training log (`psnr_log.pt`, `loss_log.pt`, `Logs.pth`, a
# `logs_filename` setting): the numbers a run recorded, not a model's tensors (a folder of
# logs, `logs/model.pt`, or a `log_dir` setting names no payload).
_LOG_FILE = re.compile(r"(?i)(?:^|_)logs?(?:\.\w+$|_?filename$)")


def _host_only_payload(call: ast.Call, ctx: Context) -> bool:
    """What is loaded is named as state that holds no device tensors: RNG state, an LR
    scheduler, metadata, a vocabulary, a config, a training log (in the path, the function's
    name or its class's)."""
    words = [word for arg in call.args[:1] for word in _path_words(arg)]
    scope = ctx.function_scope()
    if scope is not None:
        words.append(scope.name)
    # and the classes around it: a scheduler's own class (``class NoamScheduler:``) restoring
    # what its ``save`` wrote holds step counts and rates
    owner: Scope | None = ctx.scope
    while owner is not None:
        if owner.kind == "class":
            words.append(owner.name)
        owner = owner.parent
    return (
        any(payload in word.lower() for word in words for payload in _HOST_PAYLOADS)
        or any(_LOG_FILE.search(word) for word in words)
        or any(_args_file(word) for word in words)
        or any(_sampler_state(sub) for arg in call.args[:1] for sub in walk(arg))
    )


def _path_words(node: ast.AST) -> list[str]:
    """The words of a path expression that may name what the file holds. A path looked up by
    name in a mapping is named by its key alone (``config["model_params"]["ckp_path"]`` names
    a checkpoint, read from a configuration: not a configuration)."""
    if isinstance(node, ast.Subscript) and (
        isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
    ):
        return [node.slice.value]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    # `config.resume`: the setting's name says what the file holds, not the object of settings
    # it is read from (`self.vocab.path` is named by its owner too)
    if (
        isinstance(node, ast.Attribute)
        and node.attr.lower() not in _GENERIC_PATH_ATTRS
        and isinstance(node.value, (ast.Name, ast.Attribute))
    ):
        return [node.attr]
    words = [node.attr] if isinstance(node, ast.Attribute) else []
    return words + [word for child in ast.iter_child_nodes(node) for word in _path_words(child)]


# Attribute names that say only that they hold a path: their owner names the file.
_GENERIC_PATH_ATTRS = frozenset({"path", "file", "filename", "fname", "filepath", "name"})


def _loads_dataset(call: ast.Call, ctx: Context) -> bool:
    """The load is bound whole, or as the first of what it unpacks, to a name for a dataset:
    ``dataset, _ = torch.load(cache_path)`` in the classification reference scripts, a
    cached ``ImageFolder`` with its folder, which holds file paths and transforms (host
    data), not device tensors."""
    parent = ctx.parents[-1] if ctx.parents else None
    if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1):
        return False
    target = parent.targets[0]
    if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
        target = target.elts[0]
    return isinstance(target, ast.Name) and bool(
        {"dataset", "datasets"} & set(target.id.lower().split("_"))
    )


def _sampler_state(node: ast.AST) -> bool:
    """A path named for a data sampler's state, ``os.path.join(load_dir, "sampler")``: the
    position of a resumable sampler (epoch, indices), host integers. Only the file's name
    says so; a class or function named for a diffusion sampler may well load weights."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    name = node.value.lower().rsplit("/", 1)[-1]
    return name.partition(".")[0].endswith("sampler")


def _args_file(word: str) -> bool:
    """A file named for a run's arguments, ``"model_args.pth"`` (Large-DiT's ``train_args =
    torch.load(os.path.join(ckpt, "model_args.pth"))``), Hugging Face's ``"training_args.bin"``:
    a pickled ``Namespace`` or dataclass of settings, no tensors. Not the name ``args`` itself
    (``torch.load(args.ckpt)``)."""
    name = word.lower().rsplit("/", 1)[-1]
    stem, dot, _ = name.partition(".")
    return bool(dot) and stem.endswith("args")


def _lists_safe_globals(manager: ast.expr, ctx: Context) -> bool:
    """``safe_globals([...])``, or a name the function binds to it in some branch (captum's
    ``ctx = torch.serialization.safe_globals(...)`` else ``ctx = nullcontext()``)."""
    values: list[ast.expr | None] = [manager]
    scope = ctx.function_scope()
    if isinstance(manager, ast.Name) and scope is not None:
        values = bindings(scope.node).get(manager.id, [])
    return any(
        isinstance(value, ast.Call) and (ctx.call_qualname(value) or "").endswith("safe_globals")
        for value in values
    )


def _decided_elsewhere(ctx: Context) -> bool:
    """Inside ``if not weights_only:`` (the caller chose, and this branch honours it), or in a
    ``with torch.serialization.safe_globals([...]):`` block (code for torch >= 2.6, where
    ``weights_only=True`` is the default and the block lists what it may unpickle)."""
    for parent in ctx.parents:
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
            _lists_safe_globals(item.context_expr, ctx) for item in parent.items
        ):
            return True
    return any(
        isinstance(parent, (ast.If, ast.IfExp))
        and any(
            isinstance(n, (ast.Name, ast.Attribute))
            and "weights_only" in (n.id if isinstance(n, ast.Name) else n.attr)
            for n in walk(parent.test)
        )
        for parent in ctx.parents
    )


def _version_branch(call: ast.Call, ctx: Context) -> bool:
    """In one branch of an ``if`` on the torch version whose other branch passes
    ``weights_only`` itself (``if torch_version < "2.6": torch.load(p)``, ``else:
    torch.load(p, weights_only=False)``): the choice is made, and this branch is the spelling
    for the older torch (the keyword's default there; before 1.13, no keyword at all)."""
    chain = [*ctx.parents, call]
    for parent, child in itertools.pairwise(chain):
        if not isinstance(parent, ast.If) or not _names_version(parent.test):
            continue
        if child in parent.body:
            other = parent.orelse
        elif child in parent.orelse:
            other = parent.body
        else:
            continue
        if any(
            isinstance(sub, ast.Call)
            and ctx.call_qualname(sub) == "torch.load"
            and keyword(sub, "weights_only") is not None
            for stmt in other
            for sub in walk(stmt)
        ):
            return True
    return False


def _names_version(test: ast.expr) -> bool:
    """``torch.__version__ < "2.6"``, ``torch_version >= (2, 6)``, ``is_torch_version(...)``:
    the test names a version."""
    for node in walk(test):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(name, str) and "version" in name.lower():
            return True
    return False


def _in_dataset(ctx: Context) -> bool:
    """Datasets load the data files they wrote themselves, on the CPU (also through the
    file's helpers that only its ``Dataset`` classes use)."""
    if "/datasets/" in ctx.path.replace("\\", "/"):
        return True
    scope: Scope | None = ctx.scope
    while scope is not None:
        node = scope.node
        if isinstance(node, ast.ClassDef) and _is_dataset_class(node, ctx):
            return True
        scope = scope.parent
    function = ctx.function_scope()
    if function is None or function.parent is None or function.parent.kind != "module":
        return False
    name = getattr(function.node, "name", "")
    return _serves_datasets(name, function.root().node, ctx, depth=2)


def _serves_datasets(name: str, tree: ast.AST, ctx: Context, depth: int) -> bool:
    """A module-level function the file uses only inside its ``Dataset`` classes, directly or
    through other such functions (``load_image(f)`` called by ``__getitem__``): dataset code."""
    return only_used_by(name, ctx, lambda stmt: _dataset_user(stmt, tree, ctx, depth))


def _dataset_user(stmt: ast.stmt, tree: ast.AST, ctx: Context, depth: int) -> bool:
    if isinstance(stmt, ast.ClassDef):
        return _is_dataset_class(stmt, ctx)
    if isinstance(stmt, ast.FunctionDef) and depth > 0:
        return _serves_datasets(stmt.name, tree, ctx, depth - 1)
    return False  # the script's own body, or a longer chain of helpers


def _is_dataset_class(node: ast.ClassDef, ctx: Context) -> bool:
    """A ``Dataset`` subclass, or a class named as one (``class MAG240MDataset(object):``, a
    dataset of its own that reads the files it downloads and processes on the host)."""
    return node.name.endswith("Dataset") or any(
        str(ctx.qualname(base) or getattr(base, "id", "")).endswith("Dataset")
        for base in node.bases
    )


_IN_MEMORY = ("BytesIO", "TemporaryFile", "NamedTemporaryFile", "SpooledTemporaryFile")


def _round_trip(
    call: ast.Call, ctx: Context, *, wrapped: bool = False, script: bool = False
) -> bool:
    """Loading what this process just saved (an in-memory buffer, a temporary file, the same
    path given to ``torch.save`` in the same function): the saving device exists. With
    ``wrapped``, a buffer over given bytes (``BytesIO(data)``) counts too: bytes passed
    around in memory come from a process of this run (for where tensors land), though not
    necessarily from a trusted file (for what unpickling may run). With ``script``, a script's
    own statements count as a function (``torch.save(net, "m.pt")``, then
    ``torch.load("m.pt")`` at module level): the saving device exists."""
    source = call.args[0] if call.args else getattr(keyword(call, "f"), "value", None)
    if source is None:
        return True
    scope = ctx.function_scope()
    if _names_buffer(source, ctx, scope or ctx.scope, wrapped=wrapped):
        return True
    if scope is None and not script:
        return False
    owner = scope if scope is not None else ctx.scope.root()
    cached = owner.cache.get("saves")
    if cached is None:
        cached = owner.cache["saves"] = _saves(owner.node, ctx)
    key = _path_key(_file_of(source, owner.node, call.lineno), ctx)
    earlier = [line for line in cached.get(key, ()) if line < call.lineno]
    if earlier and isinstance(source, ast.Name):
        # `buffer = io.BytesIO(received)` after the save: the name now holds other bytes; a
        # save after the rebinding (a notebook's `path = "b.pt"`, `torch.save(sd, path)` for
        # a second model, then `torch.load(path)`) writes the file read again
        rebinds = [
            v.lineno
            for v in ctx.scope_bindings(owner).get(source.id, [])
            if v is not None and v.lineno <= call.lineno
        ]
        earlier = [line for line in earlier if not any(line < r for r in rebinds)]
        if not earlier:
            return False
    if earlier:
        return True
    root = receiver_root(source) if isinstance(source, (ast.Name, ast.Attribute)) else None
    # a buffer the function rewinds, not another object's `seek` (a TSV reader's row)
    if "seek" in cached and (root is None or f"seek:{root}" in cached):
        return (
            wrapped
            or root is None
            or not _written_with_given_bytes(root, source, ctx, scope or ctx.scope)
        )
    return scope is not None and _saved_by_earlier_call(key, scope, ctx)


def _path_key(path: ast.expr, ctx: Context) -> str:
    """A path's spelling with quotes and spaces made uniform: ``'mlp.params'`` saved, then
    ``"mlp.params"`` loaded, names one file."""
    try:
        return ast.unparse(path)
    except (ValueError, AttributeError):  # pragma: no cover - a node unparse cannot print
        return " ".join((ctx.segment(path) or "").split())


def _saved_by_earlier_call(key: str, scope: Scope, ctx: Context) -> bool:
    """A script's own statements call one of its functions that saves the path before the
    function that loads it: a tutorial's ``save()``, writing ``torch.save(net, "net.pkl")``,
    then ``restore_net()``, reading ``torch.load("net.pkl")``. A file of this run."""
    root = ctx.scope.root()
    if scope.parent is not root or not isinstance(root.node, ast.Module):
        return False
    calls = root.cache.get("script-calls")
    if calls is None:
        defs = {
            d.name: d
            for d in root.node.body
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        calls = root.cache["script-calls"] = [
            (sub.lineno, sub.func.id, _saves(defs[sub.func.id], ctx))
            for sub in own_nodes(root.node)
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in defs
        ]
    loads_at = [line for line, name, _ in calls if name == scope.name]
    return bool(loads_at) and any(
        line < min(loads_at) and name != scope.name and key in saved for line, name, saved in calls
    )


def _saved_by_call(call: ast.Call, ctx: Context) -> bool:
    """A call above the load, in the same function (or a script's own statements), runs code
    of the linted tree that saves to the path the load reads (:func:`~.model_saves.saved_paths`,
    a few calls deep): Informer's ``early_stopping(vali_loss, self.model, path)``, whose
    ``save_checkpoint`` writes ``path + '/' + 'checkpoint.pth'``, then ``best_model_path =
    path + '/' + 'checkpoint.pth'`` and ``torch.load(best_model_path)``; or hands the path to
    a parameter named for saving, ``train(..., 'model_scratch.pt')`` with ``def train(...,
    save_path)``. A file of this run."""
    source = _load_source(call)
    if source is None:
        return False
    scope = ctx.function_scope()
    owner = scope if scope is not None else ctx.scope.root()
    return _saved_through_calls(source, owner, call.lineno, ctx)


def _saved_through_calls(source: ast.expr, owner: Scope, line: int, ctx: Context) -> bool:
    """:func:`_saved_by_call` of the path ``source`` read at ``line`` in ``owner``."""
    keys = _path_keys(source, owner, line, ctx)
    return any(end < line and key in keys for end, key in _saves_by_call(owner, ctx))


def _saves_by_call(owner: Scope, ctx: Context) -> list[tuple[int, str]]:
    """Each path the calls of ``owner`` save to (through code of the tree), with the line the
    call ends on: found once per function, not once per load."""
    found: list[tuple[int, str]] | None = owner.cache.get("saves-by-call")
    if found is None:
        facts = file_facts(ctx)
        cls = owner.cls.node if owner.cls is not None else None
        memo = ctx.scope.root().cache.setdefault("saves-memo", {})
        found = owner.cache["saves-by-call"] = [
            (sub.end_lineno or sub.lineno, _path_key(path, ctx))
            for sub in own_nodes(owner.node)
            if isinstance(sub, ast.Call)
            for path in saved_paths(
                sub, facts, owner.node, cls if isinstance(cls, ast.ClassDef) else None, memo
            )
        ]
    return found


def _saved_by_callers(call: ast.Call, ctx: Context) -> bool:
    """The load reads a parameter of a module-level function (a notebook's ``def
    load_checkpoint(filepath): torch.load(filepath)``) that only the script's own statements
    call, each time with a path those statements saved above the call (``torch.save(checkpoint,
    'checkpoint.pth')`` in one cell, ``load_checkpoint('checkpoint.pth')`` in a later one).
    A call from another function, or from a module that imports it, hands a path of unknown
    origin, and the load is checked."""
    source = _load_source(call)
    scope = ctx.function_scope()
    root = ctx.scope.root()
    if (
        not isinstance(source, ast.Name)
        or scope is None
        or scope.parent is not root
        or not isinstance(root.node, ast.Module)
        or not isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef))
        or ctx.scope_bindings(scope).get(source.id) != [None]  # the parameter, never rebound
    ):
        return False
    node = scope.node
    params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    if source.id not in params:
        return False
    index = params.index(source.id)
    facts = file_facts(ctx)
    sites = call_sites(facts, node)
    here = {id(c) for where, c, _ in facts.calls_of(node.name) if where is root.node}
    if not sites or not all(id(site) in here for site in sites):
        return False
    saved = root.cache.get("saves")
    if saved is None:
        saved = root.cache["saves"] = _saves(root.node, ctx)
    for site in sites:
        given = next((k.value for k in site.keywords if k.arg == source.id), None)
        if given is None and len(site.args) > index:
            given = site.args[index]
        if given is None or isinstance(given, ast.Starred):
            return False
        key = _path_key(given, ctx)
        if not any(line < site.lineno for line in saved.get(key, ())) and not _saved_through_calls(
            given, root, site.lineno, ctx
        ):
            return False
    return True


def _load_source(call: ast.Call) -> ast.expr | None:
    return call.args[0] if call.args else getattr(keyword(call, "f"), "value", None)


def _path_keys(source: ast.expr, owner: Scope, line: int, ctx: Context) -> set[str]:
    """The spellings of a loaded path: its own, and for a name, that of the value the scope
    last bound it to above ``line`` (``best_model_path = path + '/' + 'checkpoint.pth'``)."""
    keys = {_path_key(source, ctx)}
    values = ctx.scope_bindings(owner).get(source.id, []) if isinstance(source, ast.Name) else []
    if values and None not in values:
        above = [v for v in values if v is not None and v.lineno < line]
        if above:
            keys.add(_path_key(max(above, key=lambda v: v.lineno), ctx))
    return keys


def _saved_above_by_name(call: ast.Call, ctx: Context) -> bool:
    """The load reads a file by a name template that the same function, or a script's own
    statements, saved to above it: pyGAT's ``torch.save(model.state_dict(),
    '{}.pkl'.format(epoch))`` every epoch, then ``torch.load('{}.pkl'.format(best_epoch))``
    after the loop. A file of this run, so the device it was saved from exists."""
    source = call.args[0] if call.args else getattr(keyword(call, "f"), "value", None)
    template = _name_template(source) if source is not None else None
    if template is None:
        return False
    scope = ctx.function_scope()
    owner = scope.node if scope is not None else ctx.scope.root().node
    nodes = own_nodes(owner) if isinstance(owner, ast.Module) else walk(owner)
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "save"
        and sub.lineno < call.lineno
        and _name_template(_save_parts(sub)[1]) == template
        for sub in nodes
    )


def _name_template(path: ast.expr | None) -> str | None:
    """The file name a path fills in, with its holes (``"{}.pkl"`` of ``'{}.pkl'.format(n)``,
    ``"%d_net.pth"`` of ``"%d_net.pth" % n``, ``"ep{}.pt"`` of ``f"ep{n}.pt"``); None for a
    path that is not built from a template."""
    text: str | None = None
    if isinstance(path, ast.Call) and isinstance(path.func, ast.Attribute):
        owner = path.func.value
        if path.func.attr == "format" and isinstance(owner, ast.Constant):
            text = owner.value if isinstance(owner.value, str) else None
    elif isinstance(path, ast.BinOp) and isinstance(path.op, ast.Mod):
        if isinstance(path.left, ast.Constant) and isinstance(path.left.value, str):
            text = path.left.value
    elif isinstance(path, ast.JoinedStr):
        text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in path.values)
    if text is None or "." not in text or not any(h in text for h in ("{", "%")):
        return None
    return text.rsplit("/", 1)[-1]


def _saves(function: ast.AST, ctx: Context) -> dict[str, list[int]]:
    """The paths ``function`` saves to (``"seek"`` for a buffer it rewinds, and ``"seek:f"``
    for the name ``f`` of what it rewinds), each with the
    lines that do: a load above every save of its path (a resume at start-up) reads what an
    earlier run wrote, perhaps on another machine."""
    found: dict[str, list[int]] = {}
    # a module's own statements: a save inside a function runs only when called, maybe never
    for sub in own_nodes(function) if isinstance(function, ast.Module) else walk(function):
        if not (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)):
            continue
        # also a helper named for the save, `misc.save_on_master(sd, path)`, `save_checkpoint`
        saves = sub.func.attr == "save" or sub.func.attr.startswith("save_")
        path = _save_parts(sub)[1] if saves else None
        if sub.func.attr == "seek":
            key = "seek"
            rewound = receiver_root(sub.func.value)
            if rewound is not None:
                found.setdefault(f"seek:{rewound}", []).append(sub.lineno)
        elif path is not None:
            key = _path_key(_file_of(path, function, sub.lineno), ctx)
        else:
            continue
        found.setdefault(key, []).append(sub.lineno)
    return found


def _file_of(path: ast.expr, owner: ast.AST, line: int) -> ast.expr:
    """The path a file object was opened on: ``P`` of ``open(P, "rb")``, or of the nearest
    ``with open(P, "wb") as f:`` above ``line`` for ``f``; anything else as it is. A save
    through a handle and a load through another handle on the same path name one file."""
    if _opens(path):
        assert isinstance(path, ast.Call)
        return _constant_of(path.args[0], owner)
    if not isinstance(path, ast.Name):
        return path
    opened = kept("opened-handles", owner, _opened_handles).get(path.id, [])
    found = [(start, where) for start, where in opened if start <= line]
    return path if not found else _constant_of(max(found, key=lambda f: f[0])[1], owner)


def _opened_handles(owner: ast.AST) -> dict[str, list[tuple[int, ast.expr]]]:
    """Each name ``owner`` binds with ``with open(P, ...) as name:`` -> (the line, ``P``)."""
    found: dict[str, list[tuple[int, ast.expr]]] = {}
    for sub in walk(owner):
        if isinstance(sub, (ast.With, ast.AsyncWith)):
            for item in sub.items:
                named, opened = item.optional_vars, item.context_expr
                if isinstance(named, ast.Name) and isinstance(opened, ast.Call) and _opens(opened):
                    found.setdefault(named.id, []).append((sub.lineno, opened.args[0]))
    return found


def _constant_of(path: ast.expr, owner: ast.AST) -> ast.expr:
    """The string a name the owner binds once, to that string alone, holds (``model_name =
    "rnn_20_epoch.net"``, then ``open(model_name, "wb")``); anything else as it is."""
    if not isinstance(path, ast.Name):
        return path
    values = bindings(owner).get(path.id, [])
    if (
        len(values) == 1
        and isinstance(values[0], ast.Constant)
        and isinstance(values[0].value, str)
    ):
        return values[0]
    return path


def _opens(node: ast.expr) -> bool:
    """``open(path, ...)``, the builtin."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "open"
        and bool(node.args)
    )


_FALLBACK = re.compile(
    r"""["']cpu["']|no[_-]cuda|--cpu|use_cpu|cpu[_-]only|use_cuda|LOCAL_RANK|local_rank|"""
    r"""init_process_group|DistributedDataParallel|map_location"""
)


# Words of code that runs one process per GPU (its rank set-up may live in another file),
# read outside import lines: `import torch.utils.data.distributed` left unused uses nothing.
_RANKS = re.compile(r"rank|world_size|distributed")
_IMPORT_LINES = re.compile(r"^[ \t]*(?:import|from)[ \t][^\n]*", re.MULTILINE)
_COMMENT_LINES = re.compile(r"^[ \t]*#[^\n]*", re.MULTILINE)
# CUDA as a choice (`--cuda`, `if opt.cuda:`, `torch.cuda.is_available()`): a CPU path exists.
_CUDA_CHOICE = re.compile(r"--cuda|use_gpu|\.cuda\b(?!\()")
# Code that follows its tensors' devices (`device = x.device`, `torch.zeros(b, t,
# device=seq.device)`): written to run where its inputs are, so a stray `.cuda()` in its
# modules' methods (a decoder's `torch.zeros(...).cuda()`) is a slip TPL102 reports.
_FOLLOWS_TENSORS = re.compile(r"\bdevice\s*=\s*[A-Za-z_][\w.]*\.device\b")


# `assert torch.cuda.is_available()` demands CUDA, and `torch.cuda.device_count()` (a query
# of the GPUs other than `is_available`) on a line that tests nothing only asks about them
# (`device_ids=range(torch.cuda.device_count())`): neither is a CPU path. In a test
# (`if torch.cuda.device_count() > 0:`) it chooses.
_CUDA_DEMAND = re.compile(r"^[ \t]*assert[ \t]+torch\.cuda\.is_available\(\)", re.MULTILINE)
_CUDA_QUERY = re.compile(r"\btorch\.cuda\.(?:device_count|current_device|get_device_\w+)\b")
# Any other `torch.cuda.<name>` uses CUDA (`torch.cuda.amp.autocast(enabled=not args.fp32)`,
# `torch.cuda.synchronize()`) whatever the line tests: it chooses nothing.
_CUDA_USE = re.compile(
    r"\btorch\.cuda\.(?!is_available\b|device_count\b|current_device\b|get_device_)\w+"
)
_TESTS = re.compile(r"\b(?:if|elif|else|while|and|or|not)\b|[<>]|[=!]=")


def _no_cuda_queries(source: str) -> str:
    """The source without what does not choose CUDA or not: an ``assert`` that CUDA is
    available (the script stops without it) and ``torch.cuda`` queries (``device_count()``)
    on lines that test nothing."""
    lines = _CUDA_USE.sub("", _CUDA_DEMAND.sub("", source)).splitlines()
    return "\n".join(
        line if _TESTS.search(_CUDA_QUERY.sub("", line)) else _CUDA_QUERY.sub("", line)
        for line in lines
    )


def _may_load_elsewhere(ctx: Context) -> bool:
    """The file can run where the checkpoint was not saved: it falls back to the CPU, runs one
    process per GPU, or is a library whose callers choose the device (no code pins one). A
    script that only ever runs on one CUDA device (``device="cuda"``, or ``model.cuda()`` with
    no CPU path, no CUDA flag or check and no ranks anywhere) has nothing to remap."""
    scope = ctx.scope.root()
    cached = scope.cache.get("loads-elsewhere")
    if cached is None:
        source = _COMMENT_LINES.sub("", ctx.source)  # code commented out chooses nothing
        # also a module constant in capitals, RAFT's `DEVICE = 'cuda'`, or a move to one GPU,
        # `pipe.to("cuda:1")`
        literal = re.search(
            r"""((?i:device)\s*=\s*|torch\.device\(\s*|\.to\(\s*)["']cuda(:\d+)?["']""", source
        )
        bare = ".cuda()" in source and not (
            _RANKS.search(_IMPORT_LINES.sub("", source))
            or _CUDA_CHOICE.search(_no_cuda_queries(source))
            or _gpu_choice(ctx)
            or _slips_in_device_following_modules(ctx)
        )
        pinned = literal is not None or bare
        cached = scope.cache["loads-elsewhere"] = bool(_FALLBACK.search(source)) or not pinned
    return bool(cached)


def _slips_in_device_following_modules(ctx: Context) -> bool:
    """Every ``.cuda()`` of the file sits in a method of an ``nn.Module`` whose file follows
    its tensors' devices (``device = x.device``): a module deciding its own device is a slip
    TPL102 reports (a decoder's ``torch.zeros(1, n).cuda()``), not a pin of the file to CUDA.
    A ``.cuda()`` anywhere else (a detector class's ``Network(path).cuda()``) pins it."""
    if not _FOLLOWS_TENSORS.search(ctx.source):
        return False
    inside: set[int] = set()
    calls: list[ast.Call] = []
    for node in walk(ctx.scope.root().node):
        if isinstance(node, ast.ClassDef) and ctx.resolver.is_module_class(node):
            inside.update(id(sub) for sub in walk(node))
        elif isinstance(node, ast.Call) and call_name(node) == "cuda":
            calls.append(node)
    return bool(calls) and all(id(call) in inside for call in calls)


# `--gpu`, `-gpu` (argparse takes one dash too), `--gpus`
_GPU_OPTION = re.compile(r"(?<![\w-])--?gpus?\b")


def _gpu_choice(ctx: Context) -> bool:
    """A ``--gpu`` option that chooses the GPU or not: a flag (``action="store_true"``) or an
    option the code tests (``if args.gpu is not None:``, ``... if opt.gpu >= 0 else "cpu"``).
    One that only names the GPUs to use (``--gpu 0``, then ``CUDA_VISIBLE_DEVICES = args.gpu``)
    leaves no CPU path."""
    if not _GPU_OPTION.search(ctx.source):
        return False
    for sub in walk(ctx.scope.root().node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "attr", "") == "add_argument":
            flags = [a.value for a in sub.args if isinstance(a, ast.Constant)]
            action = keyword(sub, "action")
            if (
                any(isinstance(f, str) and _GPU_OPTION.fullmatch(f) for f in flags)
                and action is not None
                and isinstance(action.value, ast.Constant)
                and action.value.value in ("store_true", "store_false")
            ):
                return True
        elif (
            isinstance(sub, (ast.If, ast.IfExp, ast.While))
            and any(
                (isinstance(n, ast.Attribute) and n.attr in ("gpu", "gpus"))
                or (isinstance(n, ast.Name) and n.id in ("gpu", "gpus"))
                for n in walk(sub.test)
            )
            and not _copies_option(sub)
        ):
            return True
    return False


def _copies_option(test: ast.AST) -> bool:
    """``if args.gpus: config.GPUS = args.gpus``: an option given overrides a setting (HRNet's
    GPU list); nothing chooses between a GPU and the CPU."""
    return (
        isinstance(test, ast.If)
        and isinstance(test.test, (ast.Attribute, ast.Name))
        and not test.orelse
        and all(
            isinstance(stmt, ast.Assign) and ast.dump(stmt.value) == ast.dump(test.test)
            for stmt in test.body
        )
    )


def _cuda_only_branch(call: ast.Call, ctx: Context) -> bool:
    """The statements around the load move things with ``.cuda()``: a CUDA-only code path
    (a TensorRT engine, a GPU-only branch), where the saving device is the loading one."""
    if not ctx.stmt_path:
        return False
    block, _ = ctx.stmt_path[-1]
    if len(ctx.stmt_path) < 2:
        return False  # a whole function or module body is not a branch
    if _under_cuda_check(call, ctx):
        return True
    if any(isinstance(stmt, ast.If) and _asks_for_cuda(stmt.test) for stmt in block):
        return False  # `if torch.cuda.is_available(): model = model.cuda()`: a CPU path too
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "cuda"
        for stmt in block
        for sub in walk(stmt)
    )


def _under_cuda_check(call: ast.Call, ctx: Context) -> bool:
    """The load is in the body of ``if torch.cuda.is_available():`` (its ``else`` is where
    a CPU-only machine goes): it runs only where CUDA is. Also the ``else`` of ``if not
    torch.cuda.is_available():`` (robomimic's checkpoint loader, the CPU path first), and the
    first arm of ``torch.load(p) if torch.cuda.is_available() else ...``."""
    for parent, child in zip(ctx.parents, [*ctx.parents[1:], call], strict=True):
        if (
            isinstance(parent, ast.IfExp)
            and child is parent.body
            and _cuda_present(parent.test, ctx)
        ):
            return True  # `torch.load(p) if torch.cuda.is_available() else torch.load(p, ...)`
    path = ctx.stmt_path
    for (outer, index), (inner, _) in itertools.pairwise(path):
        stmt = outer[index]
        if isinstance(stmt, ast.If) and inner is stmt.body and _cuda_present(stmt.test, ctx):
            return True
        if (
            isinstance(stmt, ast.If)
            and inner is stmt.body
            and _mapped_to_cpu(stmt.orelse)
            and _names_a_device(stmt.test)
            and not any(isinstance(n, ast.Constant) and n.value == "cpu" for n in walk(stmt.test))
        ):
            return True  # `if args.cuda: torch.load(p)`, `else: torch.load(p, map_location="cpu")`
        if (
            isinstance(stmt, ast.If)
            and inner is stmt.orelse
            and _mapped_to_cpu(stmt.body)
            and _names_the_cpu(stmt.test)
        ):
            return True  # `if cpu: torch.load(p, map_location="cpu")`, `else: torch.load(p)`
        if (
            isinstance(stmt, ast.If)
            and inner is stmt.orelse
            and isinstance(stmt.test, ast.UnaryOp)
            and isinstance(stmt.test.op, ast.Not)
            and _cuda_present(stmt.test.operand, ctx)
        ):
            return True
    return False


def _names_a_device(test: ast.expr) -> bool:
    """A test whose names speak of the device (``args.cuda``, ``use_gpu``, ``self.device``), not
    of something else a CPU-mapped ``else`` happens to sit under (``if safe_only:``)."""
    words = ("cuda", "gpu", "device", "accel")
    for sub in walk(test):
        name = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if isinstance(name, str) and any(word in name.lower() for word in words):
            return True
    return False


def _names_the_cpu(test: ast.expr) -> bool:
    """A plain test that the CPU was chosen: ``if cpu:``, ``if args.use_cpu:``, ``if device ==
    "cpu":`` (not a negation, ``if not cpu:``, nor a test joined with others)."""
    if isinstance(test, ast.Compare):
        return (
            len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and any(
                isinstance(side, ast.Constant) and side.value == "cpu"
                for side in (test.left, *test.comparators)
            )
        )
    name = dotted_name(test)
    return name is not None and "cpu" in name.rsplit(".", 1)[-1].lower()


def _mapped_to_cpu(orelse: list[ast.stmt]) -> bool:
    """The ``else`` of a branch loads with ``map_location`` naming the CPU (``torch.load(p,
    map_location="cpu")``, or ``map_location=lambda storage, loc: storage``): its test chose
    CUDA, whatever it is called (``if args.cuda:``), and the branch's own load runs only
    there."""
    return any(
        isinstance(sub, ast.Call)
        and call_name(sub) == "load"
        and (given := keyword(sub, "map_location")) is not None
        and (_is_cpu(given.value) or _keeps_storage(given.value))
        for stmt in orelse
        for sub in walk(stmt)
    )


def _cuda_present(test: ast.expr, ctx: Context) -> bool:
    """A test that holds only where CUDA is: ``torch.cuda.is_available()``, a flag bound only
    to it (Wav2Lip's ``use_cuda = torch.cuda.is_available()``, also ``and``-ed with an option),
    or a device compared equal to ``"cuda"`` (``if device == 'cuda':``, with ``device = 'cuda'
    if torch.cuda.is_available() else 'cpu'``): ``torch.load(path)`` there, and ``torch.load(
    path, map_location=...)`` in its ``else``, is the usual CPU fallback."""
    if not isinstance(test, ast.Name):
        return _asks_cuda_here(test, ctx)
    scope = ctx.function_scope()
    values = ctx.scope_bindings(scope).get(test.id) if scope is not None else None
    if values is None:
        values = ctx.scope_bindings(ctx.scope.root()).get(test.id) or []
    return bool(values) and all(
        value is not None
        and any(
            _asks_cuda_here(part, ctx)
            for part in (value.values if isinstance(value, ast.BoolOp) else [value])
            if not isinstance(value, ast.BoolOp) or isinstance(value.op, ast.And)
        )
        for value in values
    )


def _asks_cuda_here(test: ast.expr, ctx: Context) -> bool:
    """``torch.cuda.is_available()``, or ``device == "cuda"``."""
    if isinstance(test, ast.Call):
        return ctx.call_qualname(test) == "torch.cuda.is_available"
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        right = test.comparators[0]
        return isinstance(right, ast.Constant) and right.value == "cuda"
    return False


def _asks_for_cuda(test: ast.expr) -> bool:
    """A test that chooses CUDA or not: ``torch.cuda.is_available()``, ``if opt.cuda:``,
    ``if use_gpu:``, also by naming the CPU: ``if not args.use_cpu:``, or by comparing a
    device option with a backend's name: ``if opt.device == 'cuda':``."""
    for sub in walk(test):
        text = (sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", "")).lower()
        if "cuda" in text or "gpu" in text or "cpu" in text:
            return True
        if isinstance(sub, ast.Compare) and any(
            isinstance(side, ast.Constant)
            and isinstance(side.value, str)
            and side.value.split(":")[0] in {"cuda", "cpu"}
            for side in [sub.left, *sub.comparators]
        ):
            return True
    return False


def _saved_from_host(call: ast.Call, ctx: Context) -> bool:
    """The file, or a script beside it, saves a host value (``.cpu()``, NumPy, Python data)
    under the same file name this load reads (``node2vec.py`` writing
    ``torch.save(emb.weight.data.cpu(), "embedding.pt")`` for ``gnn.py`` to load): it holds
    no device tensors to restore."""
    source = call.args[0] if call.args else getattr(keyword(call, "f"), "value", None)
    if source is None:
        return False
    own = ctx.function_scope()
    wanted = _file_names(source, own.node if own is not None else None)
    if not wanted:
        return False
    if _saves_host(file_facts(ctx), wanted):
        return True
    here = os.path.abspath(ctx.path)
    for path in _siblings(os.path.dirname(here)):
        text = _text_of(path) if path != here and os.path.isfile(path) else None
        if text is None or "save" not in text or not any(name in text for name in wanted):
            continue
        facts = facts_for_file(path)
        if facts is not None and _saves_host(facts, wanted):
            return True
    return False


def _saves_host(facts: FileFacts, wanted: set[str]) -> bool:
    """A ``save`` call of the file writes a host value to one of the ``wanted`` file names
    (also a value it built itself, in a file that names no device: FastPhotoStyle's
    ``converter.py`` saving ``e1.state_dict()`` of modules it never moves)."""
    anywhere = file_names_no_device(facts.tree, "\n".join(facts.lines))
    for scope, sub in kept("save-calls", facts.tree, lambda _: _save_calls(facts)):
        payload, path = _save_parts(sub)
        if payload is not None and path is not None and _file_names(path, scope) & wanted:
            fact = facts.fact(payload, scope)
            if fact is None and anywhere and _built_here(payload, scope):
                return True
            if fact is not None and fact.where == "host":
                return True
    return False


def _built_here(payload: ast.expr, scope: ast.AST) -> bool:
    """``e1.state_dict()`` with ``e1 = VGGEncoder(1)`` in the same scope: a value the saving
    code built itself, not one it was handed (a checkpoint helper saving a trainer's
    ``self.optimizer.state_dict()``)."""
    root = payload
    while isinstance(root, (ast.Call, ast.Attribute, ast.Subscript)):
        root = root.func if isinstance(root, ast.Call) else root.value
    if not isinstance(root, ast.Name):
        return False
    values = [
        sub.value
        for sub in own_nodes(scope)
        if isinstance(sub, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == root.id for t in sub.targets)
    ]
    return bool(values) and all(isinstance(v, ast.Call) for v in values)


def _save_calls(facts: FileFacts) -> list[tuple[ast.AST, ast.Call]]:
    """The ``save`` calls of a file, each with the function (or module) it is in: found once
    per file, not once per load."""
    return [
        (scope, sub)
        for scope in [facts.tree, *(f for fs in facts.defs.values() for f in fs)]
        for sub in own_nodes(scope)
        if isinstance(sub, ast.Call) and (facts.qualname(sub.func) or "").endswith("save")
    ]


# Calls that ask whether a file is there: `os.path.exists(p)`, `os.path.isfile(p)`,
# `p.exists()`, `Path(p).is_file()`.
_EXISTS = frozenset({"exists", "isfile", "is_file", "lexists"})
# Words of a saved value that may be a model's state (its tensors live where the model did).
_STATE_WORDS = ("state", "model", "net", "ckpt", "checkpoint", "weight", "param", "optim")


def _host_cache(call: ast.Call, ctx: Context) -> bool:
    """A cache this code fills itself: the load runs when its path exists, and the other
    branch of that test computes the value and saves it to the same path (Hugging Face's
    ``if os.path.exists(cached_features_file): features = torch.load(cached_features_file)``,
    ``else: features = convert_examples_to_features(...)``, ``torch.save(features,
    cached_features_file)``; the SNLI example's cached word vectors), or as a ``try`` whose
    handler computes and saves what its body failed to load. What it reads back is
    what that branch saved; when the saved value is not a device value nor a model's state
    (``model.state_dict()``, a checkpoint), it is host data and holds no device tensors. A
    resume whose other branch trains and saves a checkpoint, or a load into a name for a
    model's state (``weights = torch.load(cache)``), is still reported."""
    source = _load_source(call)
    if source is None:
        return False
    bound = ctx.parents[-1] if ctx.parents else None
    if isinstance(bound, ast.Assign) and any(_names_state(t) for t in bound.targets):
        return False  # `weights = torch.load(cache)`: named as a model's state all the same
    key = _path_key(source, ctx)
    scope = ctx.function_scope()
    owner = scope.node if scope is not None else ctx.scope.root().node
    inner: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(parent, ast.If):
            where = _exists_test(parent.test, key, ctx)
            if where is not None:
                loads, fills = (
                    (parent.body, parent.orelse) if where else (parent.orelse, parent.body)
                )
                if any(stmt is inner for stmt in loads):
                    return _fills_from_host(fills, key, owner, ctx)
        # `try: bert = torch.load(bert_path)`, `except Exception: bert = get_bert(...)`,
        # `torch.save(bert, bert_path)` (MeloTTS): the handler fills what the body reads
        if (
            isinstance(parent, ast.Try)
            and any(stmt is inner for stmt in parent.body)
            and any(_fills_from_host(h.body, key, owner, ctx) for h in parent.handlers)
        ):
            return True
        inner = parent
    return False


def _exists_test(test: ast.expr, key: str, ctx: Context) -> bool | None:
    """True when ``test`` holds only if the file ``key`` exists (``os.path.exists(p)``, also
    joined by ``and``: ``... and not args.overwrite_cache``), False when it holds only if the
    file is missing (``not os.path.exists(p)``, also joined by ``or``), None otherwise."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _exists_test(test.operand, key, ctx)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        wanted = isinstance(test.op, ast.And)
        if any(_exists_test(value, key, ctx) is wanted for value in test.values):
            return wanted
        return None
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)):
        return None
    if test.func.attr not in _EXISTS:
        return None
    if test.args:  # os.path.exists(p)
        asked: ast.expr = test.args[0]
    else:  # p.exists(), Path(p).exists()
        asked = test.func.value
        if isinstance(asked, ast.Call) and call_name(asked) == "Path" and len(asked.args) == 1:
            asked = asked.args[0]
    return True if _path_key(asked, ctx) == key else None


def _fills_from_host(block: list[ast.stmt], key: str, owner: ast.AST, ctx: Context) -> bool:
    """``block`` saves to the path ``key``, and only values that are neither device values
    nor named as a model's state."""
    saves = [
        sub
        for stmt in block
        for sub in walk(stmt)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "save"
        and (ctx.call_qualname(sub) or "").endswith("save")
    ]
    found = False
    facts = file_facts(ctx)
    for save in saves:
        payload, path = _save_parts(save)
        if path is None or _path_key(path, ctx) != key:
            continue
        if payload is None or _names_state(payload):
            return False
        fact = facts.fact(payload, owner)
        if fact is not None and fact.on_device:
            return False
        found = True
    return found


def _names_state(node: ast.expr) -> bool:
    """A name, attribute or call in ``node`` names a model's state or a checkpoint."""
    for sub in walk(node):
        if isinstance(sub, ast.Name):
            text = sub.id
        elif isinstance(sub, ast.Attribute):
            text = sub.attr
        else:
            continue
        if any(word in text.lower() for word in _STATE_WORDS):
            return True
    return False


def _save_parts(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None]:
    """What a ``save(obj, f)`` call writes and where, given by position or by keyword
    (``torch.save(obj=model.state_dict(), f=MODEL_SAVE_PATH)``)."""
    found: list[ast.expr | None] = [None, None]
    for index, name in enumerate(("obj", "f")):
        given = keyword(call, name)
        if len(call.args) > index:
            found[index] = call.args[index]
        elif given is not None:
            found[index] = given.value
    return found[0], found[1]


def _file_names(node: ast.expr, body: ast.AST | None = None) -> set[str]:
    """The file names (string constants with a suffix) a path is built from, also through the
    names ``body`` binds it from (``name = "%s_net_%s.pth" % (epoch, label)``, then
    ``path = os.path.join(root, name)``)."""
    bound = assigned(body) if body is not None else {}
    names: set[str] = set()
    todo, seen = [node], set()
    while todo:
        for sub in walk(todo.pop()):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "." in sub.value:
                names.add(sub.value.rsplit("/", 1)[-1])
            elif isinstance(sub, ast.Name) and sub.id in bound and sub.id not in seen:
                seen.add(sub.id)
                todo.extend(bound[sub.id])
    return names


def _names_buffer(source: ast.expr, ctx: Context, scope: Scope, *, wrapped: bool = False) -> bool:
    """An in-memory buffer or temporary file, built empty: what it holds was saved here.
    ``io.BytesIO(data)`` wraps bytes read from elsewhere (a file, the network, another rank):
    a round trip only when the function saved into what ``data`` names."""
    if isinstance(source, ast.Call):
        name = ctx.call_qualname(source) or ""
        if not name.endswith(_IN_MEMORY):
            return False
        return wrapped or not _wraps_bytes(source) or _saved_into(source, ctx, scope)
    root = receiver_root(source) if isinstance(source, (ast.Name, ast.Attribute)) else None
    if root is None:
        return False
    values = ctx.scope_bindings(scope).get(root, [])
    above = [v for v in values if v is not None and v.lineno <= source.lineno]
    if above:  # the nearest binding above the load is what it reads (`buffer` reused)
        values = [max(above, key=lambda v: v.lineno)]
    for value in values:
        if isinstance(value, ast.Call) and _names_buffer(value, ctx, scope, wrapped=wrapped):
            return wrapped or not _written_with_given_bytes(root, source, ctx, scope)
    return False


def _written_with_given_bytes(root: str, source: ast.expr, ctx: Context, scope: Scope) -> bool:
    """The function fills the empty buffer itself with bytes it was given (skorch's
    ``f.write(state["__cuda_dependent_attributes__"])`` into a ``SpooledTemporaryFile`` before
    loading it), or builds it over them (``BytesIO(content)``, then ``seek(0)``), and never
    ``torch.save``s into it: a buffer over bytes from elsewhere."""
    writes = [
        sub
        for sub in walk(scope.node)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr in {"write", "writelines"}
        and receiver_root(sub.func.value) == root
        and sub.lineno <= source.lineno
    ] + [
        stmt.value
        for stmt in walk(scope.node)
        if isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id == root
        and isinstance(stmt.value, ast.Call)
        and _wraps_bytes(stmt.value)
        and stmt.lineno <= source.lineno
    ]
    if not writes:
        return False
    return not any(
        isinstance(sub, ast.Call)
        and (ctx.call_qualname(sub) or "").endswith("save")
        and any(root in names_in(arg) for arg in sub.args[1:2])
        for sub in walk(scope.node)
    )


def _wraps_bytes(call: ast.Call) -> bool:
    """``BytesIO(data)``: a buffer over bytes it is given (not ``BytesIO()``, not a temporary
    file's options)."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    return name == "BytesIO" and bool(call.args)


def _saved_into(call: ast.Call, ctx: Context, scope: Scope) -> bool:
    """The function ``torch.save``s into a name the buffer's bytes come from
    (``torch.save(obj, buf)``, then ``BytesIO(buf.getvalue())``)."""
    wanted = names_in(call.args[0])
    paths = (
        _save_parts(sub)[1]
        for sub in walk(scope.node)
        if isinstance(sub, ast.Call) and (ctx.call_qualname(sub) or "").endswith("save")
    )
    return any(path is not None and names_in(path) & wanted for path in paths)


def _load_behind(call: ast.Call, ctx: Context) -> Load | None:
    """:func:`~.model_loads.load_behind`, once per called name in a file."""
    name = dotted_name(call.func)
    if name is None:
        return None
    root = ctx.scope.root()
    qualname = ctx.qualname(call.func)
    cls = _own_class(call, ctx)
    if cls is not None:
        name = f"{cls.name}.{name}"  # self.choose_model(...): a method of the handler's class
    elif qualname is None and name not in _defined_here(root):
        return None  # neither this file's function or class, nor imported
    if qualname is not None and not in_tree(ctx.path, qualname):
        return None  # from an installed package: not the linted code
    cache: dict[str, Load | None] = root.cache.setdefault("loads-behind", {})
    if name not in cache:
        memo: dict[tuple[int, int], Load | None] = root.cache.setdefault("loads-memo", {})
        cache[name] = load_behind(call, file_facts(ctx), memo, cls)
    return cache[name]


def _own_class(call: ast.Call, ctx: Context) -> ast.ClassDef | None:
    """The class whose method ``call`` is (``self.choose_model(...)`` in a method of a class
    of this file), else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    scope = ctx.function_scope()
    if func.value.id != "self" or scope is None or scope.cls is None:
        return None
    node = scope.cls.node
    return node if isinstance(node, ast.ClassDef) else None


def _defined_here(root: Scope) -> frozenset[str]:
    """The module-level functions and classes of the file (``root``: its module scope)."""
    names: frozenset[str] | None = root.cache.get("defined-here")
    if names is None:
        body = getattr(root.node, "body", [])
        names = root.cache["defined-here"] = frozenset(
            node.name
            for node in body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        )
    return names


def _load_site(call: ast.Call, ctx: Context, what: str, via: Load | None = None) -> None:
    if in_test(ctx):
        return  # a test loads on purpose (round trips, one model per case)
    statement = next((p for p in reversed(ctx.parents) if isinstance(p, ast.stmt)), None)
    if statement is not None and id(call) in read_as_arrays(statement):
        return  # `torch.load(file.name).numpy()`: a saved tensor read as data, not a model
    loads = f"`{what}(...)`" if via is None else f"`{what}(...)` (it runs {via.describe()})"
    handler = _request_handler(ctx)
    if handler is not None and not _lazy(ctx) and not _installs_global(call, ctx):
        ctx.report(
            LOAD_PER_REQUEST.code,
            call,
            f"{loads} inside request handler `{handler}`: every request reloads the "
            "model; load it once at start-up and reuse it",
        )
        return
    loops = ctx.loops()
    if loops and _lazy(ctx):
        return  # `if bigvgan_model is None: init_bigvgan()` in a loop: loaded on the first step
    used = _names(call) | _placed_at(call, ctx)
    if loops and loops[-1] in ctx.parents:
        inside = ctx.parents[ctx.parents.index(loops[-1]) + 1 :]
        if any(isinstance(p, ast.Try) for p in inside):
            return  # a retry loop: `for _ in range(n): try: load(...)`
    for loop in loops:
        if _one_step(loop, ctx):
            continue  # `for i in tqdm(range(1)):`: a progress bar around a single load
        if _loads_into_each_module(loop):
            continue  # one load per module of a short list (a checkpoint-restore hook)
        if _sets_state(loop):
            continue  # `for opt.weights in files: detect()`: each step sets what is loaded
        if _trains_each_step(loop, call, ctx):
            continue  # a training run per step starts from fresh pretrained weights
        bound = loop_bound_names(loop, ctx)
        inside = ctx.parents[ctx.parents.index(loop) + 1 :] if loop in ctx.parents else []
        if any(isinstance(p, ast.If) and names_in(p.test) & bound for p in inside):
            continue  # a branch chosen per step: not the same load every time
        if not used & bound:
            ctx.report(
                LOAD_PER_REQUEST.code,
                call,
                f"{loads} inside a loop loads the same thing on every step; load it "
                "once before the loop",
            )
            return


def _lazy(ctx: Context) -> bool:
    """The load runs under a test that nothing is loaded yet (``if model_dict[name] is None:
    model_dict[name] = torch.hub.load(...)``): the first request for a model loads it, the
    others reuse it. Also as an expression: ``blip_model = blip_model or
    Blip.from_pretrained(p)``, ``model = load(p) if model is None else model``."""
    return any(
        (isinstance(p, (ast.If, ast.IfExp)) and not_loaded_yet(p.test))
        or (
            isinstance(p, ast.BoolOp)
            and isinstance(p.op, ast.Or)
            and dotted_name(p.values[0]) is not None
        )
        for p in ctx.parents
    )


def _installs_global(call: ast.Call, ctx: Context) -> bool:
    """``global model``, then ``model = Svc(path, ...)`` in the handler of a "load" button: the
    handler stores the model in a module-level name for the other handlers and runs none of
    it itself (``model(x)``, ``model.infer(x)``; reading ``model.spk2id.keys()`` for the page is
    no run), so loading is its job, once per click."""
    scope = ctx.function_scope()
    statement = ctx.stmt_path[-1][0][ctx.stmt_path[-1][1]] if ctx.stmt_path else None
    if scope is None or not isinstance(statement, ast.Assign) or statement.value is not call:
        return False
    declared = {
        name
        for node in own_nodes(scope.node)
        if isinstance(node, ast.Global)
        for name in node.names
    }
    stored = {t.id for t in statement.targets if isinstance(t, ast.Name)}
    if not stored or not stored <= declared or len(stored) != len(statement.targets):
        return False
    for node in own_nodes(scope.node):
        if not isinstance(node, ast.Call):
            continue
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else node.func
        if isinstance(receiver, ast.Name) and receiver.id in stored:
            return False  # `model.infer(x)`: the handler runs what it loaded
    return True


def _one_step(loop: ast.AST, ctx: Context) -> bool:
    """``for i in range(1):``, also wrapped in a progress bar, ``tqdm(range(1))``, or walked
    through the name the bar is bound to (tinychat's ``pbar = tqdm(range(1))``, then ``for i
    in pbar:`` around its checkpoint load), or over a one-item literal: a loop of one step,
    whose load runs once."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    walked: ast.expr | None = loop.iter
    if isinstance(walked, ast.Name):
        scope = ctx.function_scope() or ctx.scope.root()
        values = ctx.scope_bindings(scope).get(walked.id, [])
        walked = values[0] if len(values) == 1 else None
    while (
        isinstance(walked, ast.Call)
        and isinstance(walked.func, ast.Name)
        and walked.func.id in {"tqdm", "enumerate", "list"}
        and walked.args
    ):
        walked = walked.args[0]
    if isinstance(walked, (ast.List, ast.Tuple)):
        return len(walked.elts) == 1 and not isinstance(walked.elts[0], ast.Starred)
    return (
        isinstance(walked, ast.Call)
        and isinstance(walked.func, ast.Name)
        and walked.func.id in {"range", "trange"}
        and len(walked.args) == 1
        and isinstance(walked.args[0], ast.Constant)
        and type(walked.args[0].value) is int
        and walked.args[0].value == 1
    )


def _trains_each_step(loop: ast.AST, load: ast.Call, ctx: Context) -> bool:
    """A loop whose step trains what it loads: a few-shot study's ``for train_slice in
    train_slices:`` loads ``model = AutoModelForSequenceClassification.from_pretrained(ckpt)``,
    then runs ``trainer.train()`` on a trainer given ``model`` (also ``model.fit(...)``, or an
    optimizer over ``model.parameters()``): each run needs the pretrained weights again, not
    the ones the last run changed. A load beside the training of another model (an evaluation
    copy rebuilt from its pretrained file every epoch, then overwritten) is still one to hoist."""
    body = loop.body if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) else []
    loaded = _bound_by(load, ctx)
    if not loaded:
        return False
    nodes = [sub for stmt in body for sub in walk(stmt)]
    # names bound in the step to something built from the loaded model (`trainer = Trainer(
    # model=model, ...)`, `opt = Adam(model.parameters())`)
    holders = set(loaded)
    for sub in nodes:
        if (
            isinstance(sub, ast.Assign)
            and isinstance(sub.value, ast.Call)
            and names_in(sub.value) & loaded
        ):
            holders |= {n for t in sub.targets for n in names_in(t)}
    built = holders - loaded  # `model.train()` alone sets a mode; `trainer.train()` trains
    for sub in nodes:
        if not (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)):
            continue
        receiver, method = names_in(sub.func.value), sub.func.attr
        if method == "fit" and receiver & holders:
            return True
        if method in {"train", "step"} and not sub.args and receiver & built:
            return True
    # `history = train_loop(model, optimizer, loader, steps)`: handed to a training function
    return any(
        isinstance(sub, ast.Call)
        and _TRAINING_WORDS & set((call_name(sub) or "").lower().split("_"))
        and any(names_in(arg) & holders for arg in [*sub.args, *(k.value for k in sub.keywords)])
        for sub in nodes
    )


_TRAINING_WORDS = frozenset({"train", "fit", "finetune"})


def _bound_by(load: ast.Call, ctx: Context) -> set[str]:
    """The names the statement holding ``load`` binds (``model`` of ``model = X.from_pretrained
    (p)``, also ``model = X.from_pretrained(p).to(device)``)."""
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Assign):
            return {n for t in parent.targets for n in names_in(t)}
        if isinstance(parent, ast.stmt):
            break
    return set()


def _sets_state(loop: ast.AST) -> bool:
    """A ``for`` loop whose target is an attribute or an item (``for opt.weights in files:``,
    ``for cfg["ckpt"] in paths:``): each step stores into state the code it calls reads, so a
    call with unchanged arguments may still load a different file every step."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    target = loop.target
    parts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
    return any(isinstance(part, (ast.Attribute, ast.Subscript)) for part in parts)


def _loads_into_each_module(loop: ast.AST) -> bool:
    """A loop over modules that loads weights into each in turn: ``for model in models:``,
    ``for _ in range(len(models)):`` or ``while models:`` with ``model = models.pop()``, then
    ``model.load_state_dict(...)`` (the load-state hook of a training script). It runs once per
    module it is given, not once per step of work."""
    if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
        return False
    items, nodes = loop_items(loop, _pops)
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "load_state_dict"
        and isinstance(sub.func.value, ast.Name)
        and sub.func.value.id in items
        for sub in nodes
    )


def _pops(value: ast.expr) -> bool:
    """``models.pop()``: the next element of a collection the loop drains."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "pop"
    )


def _names(call: ast.Call) -> set[str]:
    names: set[str] = set()
    for arg in [*call.args, *(kw.value for kw in call.keywords)]:
        names |= names_in(arg)
    root = receiver_root(call.func.value) if isinstance(call.func, ast.Attribute) else None
    if root is not None:
        names.add(root)
    return names


def _placed_at(call: ast.Call, ctx: Context) -> set[str]:
    """The names of the place a load is moved to right away: in a benchmark's ``for device,
    label in PROVIDERS:``, ``BertModel.from_pretrained(p).to(device)`` loads a copy for each
    device, not the same thing every step."""
    parents = ctx.parents
    if len(parents) < 2 or not isinstance(parents[-1], ast.Attribute):
        return set()
    move = parents[-2]
    if parents[-1].attr not in {"to", "cuda"} or not isinstance(move, ast.Call):
        return set()
    return {
        name for arg in [*move.args, *(kw.value for kw in move.keywords)] for name in names_in(arg)
    }


def _request_handler(ctx: Context) -> str | None:
    """The name of the enclosing function if it serves requests (route, handler, LitAPI, cog
    predictor, Gradio event), unless its name says that loading is what it is asked to do
    (``load_model``, ``reload_weights``: a "load" button's handler). Found once per function."""
    function = ctx.function_scope()
    if function is None:
        return None
    if "request-handler" not in function.cache:
        function.cache["request-handler"] = _handler_of(function, ctx)
    found: str | None = function.cache["request-handler"]
    return found


def _handler_of(function: Scope, ctx: Context) -> str | None:
    scope: Scope | None = function
    while scope is not None:
        node = scope.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _loads_by_name(node.name):
                return None  # a "load" or "train" button's handler: loading is part of its job
            if any(_route(decorator) for decorator in node.decorator_list):
                return node.name
            if scope.cls is not None:
                if node.name in _HANDLER_METHODS or _serves(scope.cls, node.name, ctx):
                    return f"{scope.cls.name}.{node.name}"
            elif node.name in _gradio_handlers(ctx):
                return node.name
        scope = scope.parent
    return None


def _loads_by_name(name: str) -> bool:
    """A handler whose name says that loading is its job: ``load_model``, ``reload``, a
    "Train" button's ``do_train`` (it loads what it then trains), a model picker's
    ``change_gpt_weights``."""
    words = set(name.lower().split("_"))
    return bool(
        (_LOAD_WORDS | _TRAINING_WORDS) & words or (_CHOOSE_WORDS & words and _MODEL_NOUNS & words)
    )


def _route(decorator: ast.expr) -> bool:
    """``@app.post("/predict")``, ``@router.get(path)``; not ``@mock.patch("torch.load")``,
    whose first argument is a dotted name where a route has a URL path."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not (isinstance(target, ast.Attribute) and target.attr in _ROUTE_DECORATORS):
        return False
    first = decorator.args[0] if isinstance(decorator, ast.Call) and decorator.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value == "" or first.value.startswith("/")
    return True


def _serves(cls: Scope, method: str, ctx: Context) -> bool:
    """A method a serving framework calls per request: ``LitAPI.predict``, cog's
    ``BasePredictor.predict``, on a class deriving from that framework's base."""
    assert isinstance(cls.node, ast.ClassDef)
    for base in cls.node.bases:
        name = ctx.qualname(base)
        if name is None:
            continue
        for package, base_class, methods in _SERVING_BASES:
            if name.split(".")[0] == package and name.endswith(base_class) and method in methods:
                return True
    return False


def _gradio_handlers(ctx: Context) -> frozenset[str]:
    """The functions a Gradio app calls per request: ``gr.Interface(fn, ...)``,
    ``button.click(fn, ...)`` (in a file that imports gradio)."""
    scope = ctx.scope.root()
    cached: frozenset[str] | None = scope.cache.get("gradio-handlers")
    if cached is None:
        cached = scope.cache["gradio-handlers"] = _registered_handlers(scope.node, ctx)
    return cached


def _registered_handlers(tree: ast.AST, ctx: Context) -> frozenset[str]:
    facts = file_facts(ctx)
    if not _imports_gradio(facts):
        return frozenset()
    names: set[str] = set()
    for node in walk(tree):
        if isinstance(node, ast.Call):
            handler = _registered(node, facts.qualname(node.func))
            if isinstance(handler, ast.Name):
                names.add(handler.id)
            names |= _handed_to_registrar(node, ctx)
    return frozenset(names)


def _imports_gradio(facts: FileFacts) -> bool:
    return any(name.split(".")[0] == "gradio" for name in facts.resolver.names.values())


def _registered(call: ast.Call, qualname: str | None) -> ast.expr | None:
    """The function ``call`` (of ``qualname``, when it resolves) registers with Gradio
    (``gr.Interface(fn, ...)``, ``button.click(fn=run)``), else None."""
    qualname = qualname or ""
    app = qualname.startswith("gradio.") and qualname.rsplit(".", 1)[-1] in _GRADIO_APPS
    event = isinstance(call.func, ast.Attribute) and call.func.attr in _GRADIO_EVENTS
    if not (app or event) or (event and qualname):
        return None
    fn = keyword(call, "fn")
    return fn.value if fn is not None else (call.args[0] if call.args else None)


def _handed_to_registrar(call: ast.Call, ctx: Context) -> set[str]:
    """Functions ``call`` hands to a function of the linted tree that registers the
    parameter it gets them as with Gradio (``create_demo_sketch(run)``, whose
    ``run_button.click(fn=run, ...)`` makes ``run`` a handler)."""
    given = [(i, a.id) for i, a in enumerate(call.args) if isinstance(a, ast.Name)]
    if not given:
        return set()
    names: set[str] = set()
    for owner, node, _ in call_targets(file_facts(ctx), call.func):
        if not _imports_gradio(owner):
            continue
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
        registered = {
            handler.id
            for sub in walk(node)
            if isinstance(sub, ast.Call)
            and isinstance(handler := _registered(sub, owner.qualname(sub.func)), ast.Name)
        }
        names |= {name for i, name in given if i < len(params) and params[i] in registered}
    return names


FAMILY = Family(
    rules=(NO_MAP_LOCATION, NO_WEIGHTS_ONLY, LOAD_PER_REQUEST),
    checks=(
        (ast.Call, _call, (NO_MAP_LOCATION.code, NO_WEIGHTS_ONLY.code, LOAD_PER_REQUEST.code)),
        (ast.Assign, _loading_call, (LOAD_PER_REQUEST.code,)),
        (ast.AnnAssign, _loading_call, (LOAD_PER_REQUEST.code,)),
        (ast.Expr, _loading_call, (LOAD_PER_REQUEST.code,)),
    ),
    triggers=("load(", "load_file(", "load_model(", "from_pretrained", "_url("),
)
