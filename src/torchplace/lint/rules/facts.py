"""What the rules know about PyTorch, kept as data, and the small inferences built on it.

Every inference here answers "yes", "no" or "cannot tell"; rules act on "yes" only, so an
unknown receiver, a computed device or a value passed through ``**kwargs`` keeps them silent.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable

from torchplace.lint.base import Context, Scope, call_name, keyword, names_in
from torchplace.lint.nodes import kept, own_nodes, walk, walk_body
from torchplace.lint.project import project_root
from torchplace.lint.provenance import file_facts
from torchplace.lint.provenance.loops import (
    below_restarted_mark,
    branch_trains,
    counter_names,
    guard_test,
    rare_test,
    remainder_nonzero,
    restarts_mark,
)
from torchplace.lint.provenance.values import FACTORY_NAMES, _is_cpu, cpu_names
from torchplace.lint.provenance.values import moves_to_device as _moves_to_device
from torchplace.lint.resolver import dotted_name

__all__ = [
    "CASTS",
    "CUDA_ONLY",
    "DEVICE_STRING",
    "FACTORIES",
    "FROM_ELEMENTS",
    "PLACEMENT_API",
    "SYNC_CALLS",
    "TENSOR_FUNCTIONS",
    "TIMERS",
    "device_argument",
    "in_periodic_branch",
    "in_test",
    "is_device_bound_loop",
    "is_env_step",
    "is_module_expr",
    "is_tensor_annotation",
    "is_tensor_expr",
    "loop_bound_names",
    "main_test",
    "mentions",
    "moves_to_device",
    "old_loss_read",
    "only_used_by",
    "receiver_root",
    "returns_none_test",
]

# Constructors that copy a list of numbers element by element into a new tensor.
FROM_ELEMENTS = frozenset(
    {"torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor"}
)

# Factories that allocate on the default device (the CPU) unless given ``device=``.
FACTORIES = frozenset(
    f"torch.{name}"
    for name in FACTORY_NAMES
    | frozenset(
        (
            "empty_strided",
            "tril_indices",
            "triu_indices",
            "LongTensor",
            "FloatTensor",
            "Tensor",
        )
    )
)

# torch functions known to return a tensor (factories, conversions, common ops).
TENSOR_FUNCTIONS = FACTORIES | frozenset(
    f"torch.{name}"
    for name in (
        "as_tensor",
        "from_numpy",
        "cat",
        "concat",
        "stack",
        "matmul",
        "mm",
        "bmm",
        "einsum",
        "where",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "clone",
    )
)

# Tensor methods that return a tensor.
TENSOR_METHODS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "float",
        "half",
        "double",
        "long",
        "int",
        "bool",
        "bfloat16",
        "contiguous",
        "view",
        "reshape",
        "clone",
        "detach",
        "pin_memory",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "flatten",
        "repeat",
        "expand",
    }
)

# Methods of a module or tensor that place it (an override's job is to place).
PLACEMENT_API = frozenset({"cuda", "cpu", "to", "to_empty", "_apply", "type", "xpu", "mps"})

# Builtins that convert a tensor to a Python number, reading it back to the host.
CASTS = frozenset({"float", "int", "bool"})

# Calls that make the host wait for the device (explicitly or by reading a value back).
SYNC_CALLS = frozenset(
    {"synchronize", "elapsed_time", "item", "cpu", "tolist", "numpy", "block_until_ready", "wait"}
)

TIMERS = frozenset(
    {
        "time.time",
        "time.perf_counter",
        "time.monotonic",
        "time.perf_counter_ns",
        "time.time_ns",
        "time.monotonic_ns",
        "timeit.default_timer",
    }
)

# torch.cuda functions that raise (or initialise CUDA) when no CUDA device is usable. The
# memory statistics (`memory_allocated`, `max_memory_reserved`, `memory_stats`, ...) are not
# among them: where CUDA was never initialised they answer 0 (or an empty dict).
CUDA_ONLY = frozenset(
    f"torch.cuda.{name}"
    for name in (
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "current_device",
        "set_device",
        "mem_get_info",
        "synchronize",
        "reset_peak_memory_stats",
        "memory_summary",
        "current_stream",
        "default_stream",
        "Stream",
        "Event",
        "CUDAGraph",
    )
)

# An accelerator device string: "cuda", "cuda:1", "mps", "xpu:0", ...
DEVICE_STRING = re.compile(r"(cuda|mps|xpu|hpu|npu)(:\d+)?")

# Words that mark a condition as a device-availability or device-type check.
_GUARD_WORDS = (
    "cuda",
    "gpu",
    "available",
    "device",
    "accelerator",
    "hip",
    "rocm",
    "initialized",
    "nccl",
)


def in_test(ctx: Context) -> bool:
    """Whether the code is a test: a file in a ``test*`` directory, a ``test*`` file that is
    not a script (see :func:`_evaluation_script`), or a ``test*`` function in a file that
    imports ``pytest`` or ``unittest`` (a script's ``def test(model, loader)`` is an
    evaluation loop, not a test)."""
    *folders, filename = ctx.path.replace("\\", "/").lower().split("/")
    named = [part for part in folders if part.startswith(("test", "_test"))]
    if named and _test_time_package(folders, filename, ctx):
        return False
    if named and not (
        all(_TEST_SUITE.fullmatch(part) is None for part in named)
        and not _test_file_name(filename)
        and _evaluation_script(ctx)
    ):
        return True
    if _test_file_name(filename) and not _evaluation_script(ctx):
        return True
    if not _imports_test_framework(ctx):
        return False
    scope: Scope | None = ctx.scope
    while scope is not None:
        if scope.name.lower().lstrip("_").startswith("test"):
            return True
        scope = scope.parent
    return False


# A test suite's own folder (`tests/`, `testing/`); a folder that only starts with the word,
# `Test2_cnn/` of a numbered tutorial, may hold programs (see `in_test`).
_TEST_SUITE = re.compile(r"_?(tests?|testing|unittests?|test_?utils)")


def in_device_kernel(ctx: Context) -> bool:
    """Inside a Triton kernel (``@triton.jit``, also under ``@triton.autotune(...)``): its
    body runs on the device, one program per block, so nothing in it reads the device back
    (``m_size = tl.load(ptr).to(tl.int32)``, then ``if m_size > 0:``)."""
    scope: Scope | None = ctx.scope
    while scope is not None:
        node = scope.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            (ctx.qualname(d.func if isinstance(d, ast.Call) else d) or "").startswith("triton.")
            for d in node.decorator_list
        ):
            return True
        scope = scope.parent
    return False


def _test_time_package(folders: list[str], filename: str, ctx: Context) -> bool:
    """A package's ``test`` folder, below another (``lib/test/tracker/mixformer_online.py``
    of the pytracking family: the tracker as it runs at test time), holding a module that is
    no test file and imports no test framework: the model's inference code, not a test."""
    if _test_file_name(filename) or _imports_test_framework(ctx):
        return False
    path = os.path.abspath(ctx.path)
    root = project_root(os.path.dirname(path))
    if root is not None:  # the folders inside the project: its own `test/` is a suite
        folders = os.path.relpath(path, root).replace("\\", "/").lower().split("/")[:-1]
    tests = [i for i, part in enumerate(folders) if part.startswith(("test", "_test"))]
    return bool(tests) and all(folders[i] == "test" and i > 0 for i in tests)


def _test_file_name(name: str) -> bool:
    return (
        name.startswith(("test", "_test"))
        or name.endswith(("_test.py", "_tests.py"))
        or name == "conftest.py"
    )


def _imports_test_framework(ctx: Context) -> bool:
    return any(name.split(".")[0] in {"pytest", "unittest"} for name in ctx.resolver.names.values())


def _evaluation_script(ctx: Context) -> bool:
    """A ``test.py`` that is a program, not a test module: it imports no test framework, and
    parses the command line when imported (with or without ``if __name__ == "__main__":``),
    or runs from ``if __name__ == "__main__":`` (the evaluation script of a training
    repository) and defines no ``test_*`` function or ``Test*`` class for a runner to collect
    (a ``test_net(net, loader)`` the module itself calls with arguments is a helper of the
    script, not a test)."""
    module = ctx.scope.root().node
    if not isinstance(module, ast.Module) or _imports_test_framework(ctx):
        return False
    cached = _SCRIPTS.get(id(module))
    if cached is not None and cached[0] is module:
        return cached[1]
    if len(_SCRIPTS) > 256:
        _SCRIPTS.clear()
    result = _runs_as_program(module)
    _SCRIPTS[id(module)] = (module, result)
    return result


# `_evaluation_script`'s answer per parsed module (it walks the whole module)
_SCRIPTS: dict[int, tuple[ast.Module, bool]] = {}


def _runs_as_program(module: ast.Module) -> bool:
    if _parses_command_line(module):
        # a runner importing it would hand it the runner's own arguments: a script, also
        # one with no `if __name__ == "__main__":` (its statements run at the top level)
        return True
    helpers = _called_with_arguments(module)
    collected = any(
        (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")
            and (node.name not in helpers or _all_defaulted(node))
        )
        or (isinstance(node, ast.ClassDef) and _collected_class(node))
        for node in module.body
    )
    if collected:
        return False
    if any(main_test(node) is not None for node in module.body):
        return True
    if not any(isinstance(node, _DEFINITIONS) for node in module.body):
        # a flat program (pytorch-retinanet's `test.py`: load, predict, draw): it defines
        # nothing, and its statements call things (not only imports and constants)
        return any(
            isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Call)
            for node in module.body
        )
    # no `__main__`: code other modules import (ENet's `test.py` holding the `Test` loop that
    # `main.py` runs) when it defines something and nothing a runner would collect by name
    # (pytest takes every module-level `test*` function, `def test(opt)` too)
    return any(isinstance(node, _DEFINITIONS) for node in module.body) and not any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
        for node in module.body
    )


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _collected_class(node: ast.ClassDef) -> bool:
    """A ``Test*`` class a runner collects: one without an ``__init__`` of its own (pytest
    skips a class that has one; ``unittest``'s are found by the framework import)."""
    return node.name.startswith("Test") and not any(
        isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body
    )


def _all_defaulted(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Every parameter has a default (``def test_cell(device="cpu"):``): a runner collects
    it and calls it bare, whatever the module's own ``__main__`` hands it."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    keyword_only = [a for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return len(args.defaults) == len(positional) and not keyword_only


def _parses_command_line(module: ast.Module) -> bool:
    """A module-level statement (outside ``if __name__ == "__main__":``) that parses the
    command line: ``args = parser.parse_args()``."""
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if main_test(node) is not None:
            continue
        for sub in walk(node):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"parse_args", "parse_known_args"}
            ):
                return True
    return False


def _called_with_arguments(module: ast.Module) -> set[str]:
    """Names of the module's functions that its own code calls with arguments: a
    ``test_net(save_folder, net, ...)`` helper of an evaluation script, not a runner's test."""
    return {
        sub.func.id
        for sub in walk(module)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Name)
        and (sub.args or sub.keywords)
    }


# Words of code that places work on an accelerator, or hands that to a framework or a helper.
# `xla` as a word of its own (`torch_xla`, `xla_device`), not matplotlib's `plt.xlabel(...)`
DEVICE_WORDS = re.compile(
    # not `per_device_train_batch_size`, a Trainer's batch size that names no device
    r"(?<![a-z])(?<!per_)(?:cuda|device|gpu|accelerat|fabric|mps|xla(?![a-z])|tpu|distributed)"
    r"|\.to\(",
    re.I,
)


# The words that name an accelerator or a way to reach one (DEVICE_WORDS without `device`).
_ACCELERATOR_WORDS = re.compile(
    r"(?<![a-z])(?:cuda|gpu|accelerat|fabric|mps|xla(?![a-z])|tpu|distributed)", re.I
)


def names_no_device(ctx: Context) -> bool:
    """The file names no device, accelerator or placement, or only the CPU: no accelerator
    word, and every name it binds for a device holds the CPU (theseus' state-estimation
    example, ``device = "cpu"``, then ``torch.empty(n, device=device)`` and
    ``model.to(device)``), with no parameter for one."""
    return file_names_no_device(ctx.scope.root().node, ctx.source)


def file_names_no_device(tree: ast.AST, source: str) -> bool:
    """:func:`names_no_device` of a file's tree and text, worked out once per tree."""
    return kept("names-no-device", tree, lambda node: _names_no_device(node, source))


def _names_no_device(tree: ast.AST, source: str) -> bool:
    # code only: `# device = torch.device("cuda")  # Uncomment this to run on GPU`
    code = "\n".join(line.partition("#")[0] for line in source.splitlines())
    return DEVICE_WORDS.search(source) is None or (
        _ACCELERATOR_WORDS.search(code) is None and _binds_cpu_only(tree)
    )


def _binds_cpu_only(tree: ast.AST) -> bool:
    bound = False
    for node in walk(tree):
        if isinstance(node, ast.arg) and "device" in node.arg.lower():
            return False  # a device handed in: any
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [dotted_name(t) or "" for t in targets]
        if not any("device" in name.lower() for name in names):
            continue
        if node.value is None or not _names_cpu(node.value):
            return False
        bound = True
    return bound


def _names_cpu(value: ast.expr) -> bool:
    """``"cpu"`` or ``torch.device("cpu")``."""
    if isinstance(value, ast.Call) and (dotted_name(value.func) or "").endswith("device"):
        value = value.args[0] if len(value.args) == 1 and not value.keywords else value
    return isinstance(value, ast.Constant) and value.value == "cpu"


def cpu_only_script_class(cls: Scope, ctx: Context) -> bool:
    """A class built by the module-level code of a script that never names a device, an
    accelerator or a placement (RWKV's ``math_demo/run.py``: ``model = RWKV_RNN(args)`` at
    the top level, its weights loaded with ``map_location="cpu"``), or built by such a class
    of the file (a ``Transformer`` whose ``__init__`` builds its ``Encoder``): its tensors and
    its inputs stay on the CPU. A file that only builds the class under ``if __name__ ==
    "__main__":`` is a library with a smoke check: others import the class and move it;
    unless that block is the program itself, parsing a command line or training the model
    (``parser.parse_args()``, ``loss.backward()``, ``optimizer.step(closure)``: the PyTorch
    examples' ``time_sequence_prediction/train.py``), which runs on the CPU all the same."""
    built = kept(
        "cpu-only-builds",
        ctx.scope.root().node,
        lambda module: (
            _built_classes(module)
            if isinstance(module, ast.Module) and names_no_device(ctx)
            else frozenset()
        ),
    )
    return cls.name in built


def _built_classes(module: ast.Module) -> frozenset[str]:
    """The classes of ``module`` its own program builds (:func:`cpu_only_script_class`), and
    those the classes it builds build in turn."""
    classes = {c.name: c for c in module.body if isinstance(c, ast.ClassDef)}

    def called(nodes: list[ast.AST]) -> set[str]:
        return {
            sub.func.id
            for node in nodes
            for sub in walk(node)
            if isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id in classes
        }

    built = called(
        [
            stmt
            for stmt in module.body
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and (main_test(stmt) is None or _runs_program(stmt))
        ]
    )
    todo = list(built)
    while todo:
        for name in called([classes[todo.pop()]]) - built:
            built.add(name)
            todo.append(name)
    return frozenset(built)


def cpu_only_program(ctx: Context) -> bool:
    """A script that never names a device, an accelerator or a placement and runs its own
    program: a top-level statement, or its ``if __name__ == "__main__":`` block, that parses a
    command line or trains, itself or through the file's functions it calls, two calls deep
    (minimalRL's ``acer.py``: ``main()``, whose loop runs ``train(model, optimizer, memory)``,
    stepping the optimizer). Every tensor of such a file lives on the CPU, also those its
    functions are handed."""
    root = ctx.scope.root()
    cached: bool | None = root.cache.get("cpu-only-program")
    if cached is None:
        module = root.node
        cached = False
        if isinstance(module, ast.Module) and names_no_device(ctx):
            defs = {
                d.name: d
                for d in module.body
                if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
            cached = any(
                _program_through(stmt, defs, 2)
                for stmt in module.body
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            )
        root.cache["cpu-only-program"] = cached
    return cached


def _program_through(
    node: ast.AST, defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef], depth: int
) -> bool:
    """``node`` runs a program (:func:`_runs_program`), or calls a function of ``defs`` that
    does, ``depth`` calls deep at most."""
    if _runs_program(node):
        return True
    if depth == 0:
        return False
    called = {
        sub.func.id
        for sub in walk(node)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in defs
    }
    return any(_program_through(defs[name], defs, depth - 1) for name in sorted(called))


def _runs_program(guard: ast.AST) -> bool:
    """An ``if __name__ == "__main__":`` block that is a program, not a quick check: it
    parses a command line (``parser.parse_args()``) or trains (``.backward()``, an
    optimizer's ``step``)."""
    for sub in walk(guard):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in {"parse_args", "parse_known_args", "backward"}:
                return True
            owner = sub.func.value
            if (
                sub.func.attr == "step"
                and isinstance(owner, ast.Name)
                and "optim" in owner.id.lower()
            ):
                return True
    return False


def main_test(node: ast.stmt) -> ast.Compare | None:
    """The test of ``if __name__ == "__main__":`` (a comparison of ``__name__``), if ``node``
    is such a guard."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return None
    left = node.test.left
    return node.test if isinstance(left, ast.Name) and left.id == "__name__" else None


def mentions(node: ast.AST, words: tuple[str, ...] = _GUARD_WORDS) -> bool:
    """Whether any name, attribute or string inside ``node`` contains one of ``words``."""
    for sub in walk(node):
        if isinstance(sub, ast.Name):
            text = sub.id
        elif isinstance(sub, ast.Attribute):
            text = sub.attr
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            text = sub.value
        elif isinstance(sub, ast.arg):
            text = sub.arg
        else:
            continue
        lowered = text.lower()
        if any(word in lowered for word in words):
            return True
    return False


# Calls that build or update a mapping or namespace: `device=X` there is a stored value.
_RECORDS = frozenset({"dict", "OrderedDict", "SimpleNamespace", "Namespace", "update"})


def device_argument(call: ast.Call, ctx: Context) -> ast.expr | None:
    """The expression a call passes as its device, if it is a placement call.

    ``torch.device(X)``, ``torch.Generator(X)``, ``t.to(X)``, ``t.to(device=X)``, ``t.cuda(X)``,
    any ``device=X`` and a ``device_map=X`` that names one device (not ``"auto"``, nor a map),
    except in a record (``dict(device=X, rank=r)``, ``SimpleNamespace(device=X)``,
    ``config.update(device=X)``), which stores the device's name for a caller.
    """
    kw = keyword(call, "device")
    if kw is not None:
        return None if call_name(call) in _RECORDS else kw.value
    name = call_name(call)
    if name == "to" and isinstance(call.func, ast.Attribute) and call.args:
        return call.args[0]
    if name == "device" and call.args and ctx.call_qualname(call) == "torch.device":
        return call.args[0]
    if name == "Generator" and call.args and ctx.call_qualname(call) == "torch.Generator":
        return call.args[0]  # `torch.Generator("cuda")`: the device it draws on
    mapped = keyword(call, "device_map")  # `from_pretrained(p, device_map="cuda")`: one device
    if mapped is not None and isinstance(mapped.value, ast.Constant):
        return mapped.value
    return None


def receiver_root(node: ast.expr) -> str | None:
    """``self.x.y`` -> ``self``; ``x`` -> ``x``; anything else -> None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def is_module_expr(node: ast.expr, ctx: Context) -> bool:
    """Whether ``node`` is certainly an ``nn.Module``: ``self`` in a module, or a module built."""
    if isinstance(node, ast.Name) and node.id == "self":
        scope = ctx.function_scope()
        return scope is not None and scope.cls is not None and scope.cls.is_module_class
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ctx.resolver.local_module_classes:
            return True
        name = ctx.qualname(func)
        from torchplace.lint.resolver import is_module_base

        return name is not None and is_module_base(name)
    return False


def is_tensor_expr(
    node: ast.expr,
    ctx: Context,
    scope: Scope | None,
    depth: int = 0,
    visiting: frozenset[str] = frozenset(),
) -> bool:
    """Whether ``node`` is certainly a tensor (a torch call, a tensor method, a typed name)."""
    if depth > 4:
        return False
    if isinstance(node, ast.Call):
        name = ctx.call_qualname(node)
        if name is not None:
            return name in TENSOR_FUNCTIONS
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in TENSOR_METHODS:
            return is_tensor_expr(func.value, ctx, scope, depth + 1, visiting)
        return False
    if isinstance(node, ast.Name) and scope is not None:
        if node.id in visiting:
            return True  # `x = x.to(d)`: a tensor stays a tensor; the other bindings decide
        bindings = ctx.scope_bindings(scope).get(node.id)
        annotation = ctx.param_annotation(scope, node.id)
        annotated = annotation is not None and _is_tensor_annotation(annotation, ctx)
        if bindings is None:
            return False
        values = [value for value in bindings if value is not None]
        unknown = len(bindings) - len(values)
        # Every binding must be a tensor; a parameter counts when annotated as one.
        if unknown > (1 if annotated else 0):
            return False
        if unknown == 0 and not values:
            return False
        inner = visiting | {node.id}
        return all(is_tensor_expr(value, ctx, scope, depth + 1, inner) for value in values)
    return False


def _is_tensor_annotation(node: ast.expr, ctx: Context) -> bool:
    return is_tensor_annotation(node, ctx)


def is_tensor_annotation(node: ast.expr, ctx: Context, *, optional: bool = False) -> bool:
    """``torch.Tensor`` (also as a string); with ``optional``, ``Optional[Tensor]`` and
    ``Tensor | None`` too. A union with anything else (``Union[Parameter, Tensor]``) is not."""
    name = ctx.qualname(node)
    if name in {"torch.Tensor", "torch.FloatTensor", "torch.LongTensor"}:
        return True
    if isinstance(node, ast.Constant) and node.value in {"Tensor", "torch.Tensor"}:
        return True
    if not optional:
        return False
    if isinstance(node, ast.Subscript) and ctx.qualname(node.value) in {
        "typing.Optional",
        "Optional",
    }:
        return is_tensor_annotation(node.slice, ctx)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        nones = [s for s in sides if isinstance(s, ast.Constant) and s.value is None]
        return len(nones) == 1 and all(
            is_tensor_annotation(s, ctx) for s in sides if s is not nones[0]
        )
    return False


def moves_to_device(call: ast.Call, ctx: Context) -> bool:
    """Whether a ``.to(...)``/``.cuda(...)`` call changes device (not only the dtype)."""
    return _moves_to_device(call, ctx.qualname)


def is_device_bound_loop(loop: ast.AST, ctx: Context) -> bool:
    """Whether a loop is a training or inference step loop that runs on a device.

    Evidence, in the loop itself (not in functions defined inside it): a ``.backward()``,
    an optimizer ``.step()``/``.zero_grad()``, or the loop's own items moved to a device
    (``for x, y in loader: x = x.to(device)``). A loop that merely touches a device now and
    then (a conversion pass over a state dict, a test's checks) is not one.
    """
    key = f"device-bound:{id(loop)}"
    scope = ctx.scope
    cached = scope.cache.get(key)
    if cached is not None:
        return bool(cached)
    result = False
    items: set[str] = set()
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        items = names_in(loop.target)
    elif isinstance(loop, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        items = {name for g in loop.generators for name in names_in(g.target)}
    for sub in _loop_nodes(loop):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            name = sub.func.attr
            if name == "backward" or (name in {"step", "zero_grad"} and not sub.args):
                result = True
            elif name in {"cuda", "to"} and moves_to_device(sub, ctx) and not _to_cpu(sub):
                result = receiver_root(sub.func.value) in items and _over_loader(loop)
            if result:
                break
    scope.cache[key] = result
    return result


def _over_loader(loop: ast.AST) -> bool:
    """The loop iterates a data loader (by the name it is bound to)."""
    iters: list[ast.expr] = []
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        iters.append(loop.iter)
    elif isinstance(loop, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        iters.extend(g.iter for g in loop.generators)
    for node in iters:
        for sub in walk(node):
            text = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", "")
            if "loader" in text.lower() or text == "DataLoader":
                return True
    return False


def _to_cpu(call: ast.Call) -> bool:
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    return _is_cpu(target)


def copies_to_cpu(call: ast.Call, ctx: Context) -> bool:
    """``x.to("cpu")``, ``model.to(torch.device("cpu"), dtype)``, ``x.to(device="cpu")``, or
    ``x.to(cpu_device)`` with ``cpu_device = torch.device("cpu")`` the name's only binding in
    the function, without ``non_blocking=True``: a copy to the host, which waits for the
    device as ``.cpu()`` does."""
    flag = keyword(call, "non_blocking")
    if flag is not None and not (isinstance(flag.value, ast.Constant) and not flag.value.value):
        return False
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    if isinstance(target, ast.Name):
        scope = ctx.function_scope()
        return scope is not None and target.id in cpu_names(scope.node)
    return _is_cpu(target)


def in_periodic_branch(
    ctx: Context,
    node: ast.AST | None = None,
    through: Callable[[ast.AST], bool] | None = None,
) -> bool:
    """Inside a branch taken on few steps: ``if step % log_every == 0:``, a test naming logging
    or debugging, ``if i == 0:`` (one step), ``if n < 10:`` (the first few), or a flag computed
    with ``%`` (``regularize = i % every == 0``). The test of such a branch (``node`` inside
    it) runs on every step. The search stops at the innermost loop, or goes on past the loops
    ``through`` accepts (``for k, v in losses.items():`` inside ``if step % 100 == 0:``)."""
    child = node
    passed: list[ast.AST] = []  # loops on the way out: asked of `through` once a branch is found
    for parent in reversed(ctx.parents):
        if not passed and _after_rare_guard(parent, child, ctx):
            return True  # `if not should_log(step): return`, then the logging reads
        if isinstance(parent, (ast.For, ast.AsyncFor)) and child is parent.iter:
            child = parent  # the header of a loop inside the branch: runs with the branch
            continue
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            if through is None:
                return False
            passed.append(parent)
            child = parent
            continue
        if (
            isinstance(parent, ast.If)
            and (child is None or child is not parent.test)
            and (
                _rare_else(parent, ctx)
                if any(child is stmt for stmt in parent.orelse)
                else (
                    _rare_test(parent.test, ctx)
                    or _sets_once(parent, child, ctx)
                    or _throttled(parent, child)
                )
            )
            and not branch_trains(parent)
            and not _tests_as_a_training_branch(parent, ctx)
        ):
            return through is None or all(through(loop) for loop in passed)
        child = parent
    return False


def _tests_as_a_training_branch(branch: ast.If, ctx: Context) -> bool:
    """KAIR's GAN step: ``if current_step % self.D_update_ratio == 0 and ...:`` steps the
    generator, and a later branch of the very same test logs its losses: read on every
    generator step, the cadence of that training, not a rare one."""
    scope = ctx.function_scope()
    if scope is None:
        return False
    kind, shape = type(branch.test), ast.dump(branch.test)
    return any(
        isinstance(node, ast.If)
        and node is not branch
        and type(node.test) is kind  # before the dump: most tests differ by their kind
        and ast.dump(node.test) == shape
        and branch_trains(node)
        for node in own_nodes(scope.node)
    )


def _rare_else(branch: ast.If, ctx: Context) -> bool:
    """The ``else`` of a branch runs on the steps its test does not hold: on most steps when
    the test holds on few (``if args.mlperf_logging:`` copying the scores, ``else:`` scoring
    each batch on the host), on few only when the test is such a test negated (``if not
    should_log(step): ...``, ``else:`` the logging)."""
    test = branch.test
    return (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and _rare_test(test.operand, ctx)
    )


def _after_rare_guard(parent: ast.AST, child: ast.AST | None, ctx: Context) -> bool:
    """``child``, a statement of a block of ``parent``, follows a guard of that block that
    leaves on all but a few steps: ``if not self.metrics.should_log(step): return`` (a test
    naming logging, negated), ``if step % every: continue`` (true on every step but one in
    N). What follows runs only on the steps the guard lets through, as the body of ``if
    should_log(step):`` would (unless it trains)."""
    if not isinstance(child, ast.stmt):
        return False
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list) or child not in block:
            continue
        index = block.index(child)
        for at, guard in enumerate(block[:index]):
            test = guard_test(guard)
            if test is None:
                continue
            rare = _leaves_on_most(test, ctx) or _tick_guard(test, block[at + 1 :], ctx)
            rest = ast.If(test=test, body=block[at + 1 :], orelse=[])
            if rare and not branch_trains(rest):
                return True
    return False


def _leaves_on_most(test: ast.expr, ctx: Context) -> bool:
    """The test of a guard that leaves on all but a few steps: ``step % every`` (or ``!= 0``),
    a rare test negated (``not should_log(step)``), or either joined by ``or`` with anything
    (``(step - 1) % every != 0 or self.last == step``: what follows needs every part false)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(_leaves_on_most(value, ctx) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _rare_test(test.operand, ctx)
    return remainder_nonzero(test)


def _tick_guard(test: ast.expr, rest: list[ast.stmt], ctx: Context) -> bool:
    """``if (not done) and (cur_tick != 0) and (cur_nimg < tick_start_nimg + every):
    continue`` (StyleGAN's training loop): the statements after it run once per tick, when the
    count passes the mark that they then restart (``tick_start_nimg = cur_nimg``), else only
    on the first tick (``cur_tick`` a count the loop steps up) and the last step (``done``
    bound to ``cur_nimg >= total``)."""
    values = (
        test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    )
    ticks = [value for value in values if below_restarted_mark(value, rest)]
    loops = [p for p in ctx.parents if isinstance(p, (ast.For, ast.AsyncFor, ast.While))]
    if not ticks or not loops:
        return False
    scope = ctx.function_scope() or ctx.scope.root()
    return all(
        _first_steps_only(value, loops[-1]) or _until_done(value, scope, ctx)
        for value in values
        if value not in ticks
    )


def _first_steps_only(test: ast.expr, loop: ast.AST) -> bool:
    """``cur_tick != 0`` (also ``> 0``) of a count the loop steps up (``cur_tick += 1``):
    false before its first step up only."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.NotEq, ast.Gt))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 0
    ):
        return False
    name = dotted_name(test.left)
    return name is not None and any(
        isinstance(sub, ast.AugAssign)
        and isinstance(sub.op, ast.Add)
        and dotted_name(sub.target) == name
        for sub in _loop_nodes(loop)
    )


def _until_done(test: ast.expr, scope: Scope, ctx: Context) -> bool:
    """``not done`` with ``done`` bound only to ``count >= total`` (or ``>``), or to ``True``
    (an abort): false once the run is over."""
    if not (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and isinstance(test.operand, ast.Name)
    ):
        return False
    values = ctx.scope_bindings(scope).get(test.operand.id, [])
    reached = [
        value
        for value in values
        if isinstance(value, ast.Compare)
        and len(value.ops) == 1
        and isinstance(value.ops[0], (ast.GtE, ast.Gt))
    ]
    ended = [v for v in values if isinstance(v, ast.Constant) and v.value is True]
    return bool(reached) and len(reached) + len(ended) == len(values)


def _sets_once(branch: ast.If, child: ast.AST | None, ctx: Context) -> bool:
    """``if init_loss is None: init_loss = loss.item()``: the branch binds the very name it
    finds unset, so it runs on the first step only, unless the enclosing loop unsets the name
    again (``hidden = None`` at the top of each step); also, outside a loop, an attribute of
    ``self`` that such a branch fills (``if not exists(self.av): self.av = ...``, a lazy cache
    of the instance), unless another method of the class unsets it."""
    if child is None or child not in branch.body:
        return False
    name = _unset_name(branch.test, ctx)
    if name is None:
        return False
    sets = _assigned(branch.body, name)
    if not sets or any(_is_none(value) for value in sets):
        return False
    loops = [p for p in ctx.parents if isinstance(p, (ast.For, ast.AsyncFor, ast.While))]
    if loops:
        nodes: Iterable[ast.AST] = _loop_nodes(loops[-1])
    else:
        cls = next((p for p in reversed(ctx.parents) if isinstance(p, ast.ClassDef)), None)
        if cls is None or not name.startswith("self."):
            return False
        nodes = (
            sub
            for item in cls.body
            if not (isinstance(item, ast.FunctionDef) and item.name == "__init__")
            for sub in walk(item)
        )
    return not any(
        isinstance(sub, ast.Assign)
        and _is_none(sub.value)
        and any(dotted_name(target) == name for target in sub.targets)
        for sub in nodes
    )


def _unset_name(test: ast.expr, ctx: Context) -> str | None:
    """The name ``test`` finds unset: ``x is None``, or ``not exists(x)`` of a function of
    the file that only returns ``v is not None``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = test.operand
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and len(call.args) == 1
            and _not_none_helper(call.func.id, ctx)
        ):
            return None
        return dotted_name(call.args[0])
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is)
        and _is_none(test.comparators[0])
    ):
        return dotted_name(test.left)
    return None


def _not_none_helper(name: str, ctx: Context) -> bool:
    """``def exists(val): return val is not None``, a function of the file."""
    facts = file_facts(ctx)
    return any(
        facts.parent.get(id(item)) is facts.tree and returns_none_test(item)
        for item in facts.defs.get(name, [])
    )


def returns_none_test(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    ops: tuple[type[ast.cmpop], ...] = (ast.IsNot,),
) -> bool:
    """``def exists(val): return val is not None`` (a docstring aside): a function of one
    parameter that only tests it against ``None`` with one of ``ops``."""
    params = [a.arg for a in function.args.args]
    body = [
        stmt
        for stmt in function.body
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
    ]
    ret = body[0] if len(body) == 1 else None
    return (
        len(params) == 1
        and isinstance(ret, ast.Return)
        and isinstance(ret.value, ast.Compare)
        and len(ret.value.ops) == 1
        and isinstance(ret.value.left, ast.Name)
        and ret.value.left.id == params[0]
        and isinstance(ret.value.ops[0], ops)
        and _is_none(ret.value.comparators[0])
    )


def _throttled(branch: ast.If, child: ast.AST | None) -> bool:
    """In the body of a branch that restarts the mark it measures from (see
    :func:`~torchplace.lint.provenance.loops.restarts_mark`): once per interval."""
    return child is not None and child in branch.body and restarts_mark(branch)


def _assigned(body: list[ast.stmt], name: str) -> list[ast.expr]:
    """The values that statements of ``body`` assign to ``name``."""
    return [
        stmt.value
        for stmt in body
        if isinstance(stmt, ast.Assign)
        and any(dotted_name(target) == name for target in stmt.targets)
    ]


def _is_none(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def _outer_counter(test: ast.expr, ctx: Context) -> bool:
    """``if crop < 1:`` where ``crop`` counts a loop around the loop the branch is in (``for
    crop in range(n): for x in loader: if crop < 1:``): it picks whole passes of the inner
    loop, and holds on every step of the first. (``if batch_i == 0:`` right in the loop that
    ``batch_i`` counts picks one step.)"""
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)):
        return False
    parents = ctx.parents
    at = next((i for i, p in enumerate(parents) if getattr(p, "test", None) is test), None)
    if at is None:
        return False
    loops = [p for p in parents[:at] if isinstance(p, (ast.For, ast.AsyncFor, ast.While))]
    return any(
        isinstance(loop, (ast.For, ast.AsyncFor)) and test.left.id in names_in(loop.target)
        for loop in loops[:-1]
    )


def _helper_test(test: ast.expr, ctx: Context) -> ast.expr | None:
    """The test a function of the file (or of a module of the linted tree it imports) returns
    when it is one ``return`` of a comparison: lucidrains' ``divisible_by(num, den)``,
    ``return (num % den) == 0``."""
    if not isinstance(test, ast.Call):
        return None
    found = file_facts(ctx).function_def(test.func)
    if found is None:
        return None
    body = [s for s in found[1].body if not isinstance(s, ast.Expr)]  # past a docstring
    if len(body) == 1 and isinstance(body[0], ast.Return):
        value = body[0].value
        if isinstance(value, (ast.Compare, ast.BoolOp)):
            return value
    return None


def _rare_test(test: ast.expr, ctx: Context) -> bool:
    if (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and all(_rare_test(value, ctx) for value in test.values)
    ):
        return True  # `if epoch_eval or step_eval:`: each alternative true on few steps
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        # rare when one of its terms is (`i % log_interval == 0 and master` with an interval
        # of 1 is not; nor `self.logger == "tensorboard" and is_main`, a setting and a rank)
        rest = [value for value in test.values if not _every_step(value, ctx)]
        return any(_rare_test(value, ctx) for value in rest)
    if _every_step(test, ctx) or _outer_counter(test, ctx):
        return False
    if rare_test(test):
        return not _fixed_setting(test, ctx)
    wrapped = _helper_test(test, ctx)
    if wrapped is not None and rare_test(wrapped):
        return True  # `if divisible_by(i, 10):` with `return (num % den) == 0`
    if _one_count(test, ctx):
        return True
    flag = test.operand if isinstance(test, ast.UnaryOp) else test
    if not isinstance(flag, ast.Name):
        return False
    # `if regularize:` with `regularize = i % every == 0`, in a function or a script's body
    scope = ctx.function_scope() or ctx.scope.root()
    values = ctx.scope_bindings(scope).get(flag.id, [])
    return any(
        value is not None
        and (
            any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in walk(value))
            or (isinstance(value, (ast.Compare, ast.BoolOp)) and rare_test(value))
        )
        for value in values
    )


def _one_count(test: ast.expr, ctx: Context) -> bool:
    """``if i == warm_up:`` with ``i`` the counter of an enclosing loop (``for i in
    tqdm(range(runs)):``, or the index of ``enumerate``) and ``warm_up`` a value that loop never
    rebinds: it holds on one step at most (Hiera's benchmark restarting its clock after the
    warm-up). Also ``if i in picked:``, the counter looked up among chosen steps
    (``np.linspace(0, iters, 10, dtype=int)``, a list of milestones; not a ``range`` without a
    stride, which may hold every step). An item compared with a value (``if label ==
    target:``) may hold on any step."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.In))
        and isinstance(test.left, (ast.Name, ast.Attribute))
    ):
        return False
    chosen = test.comparators[0]
    if (
        isinstance(test.ops[0], ast.In)
        and isinstance(chosen, ast.Call)
        and call_name(chosen) in {"range", "trange"}
        and len(chosen.args) < 3
    ):
        return False
    counter = dotted_name(test.left)
    scope = (ctx.function_scope() or ctx.scope.root()).node
    for loop in ctx.parents:
        if isinstance(loop, (ast.For, ast.AsyncFor)) and counter in counter_names(loop, scope):
            return not names_in(chosen) & loop_bound_names(loop, ctx)
        if (
            isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
            and counter is not None
            and _stepped_counter(loop, counter)
        ):
            return not (names_in(chosen) - {"self"}) & loop_bound_names(loop, ctx)
    return False


def _stepped_counter(loop: ast.For | ast.AsyncFor | ast.While, counter: str) -> bool:
    """The loop steps ``counter`` by a positive constant once per step, in its own body
    (``self.global_step += 1``), and binds it nowhere else: a step count, which meets one of
    a few chosen steps (``if self.global_step in self.opt.upsample_steps:``) on a few steps
    only."""
    steps = [
        stmt
        for stmt in loop.body
        if isinstance(stmt, ast.AugAssign)
        and isinstance(stmt.op, ast.Add)
        and dotted_name(stmt.target) == counter
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, int)
        and not isinstance(stmt.value.value, bool)
        and stmt.value.value > 0
    ]
    if len(steps) != 1:
        return False
    for sub in walk(loop):
        if sub is steps[0]:
            continue
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any(dotted_name(t) == counter for target in targets for t in walk(target)):
                return False
        if isinstance(sub, (ast.For, ast.AsyncFor)) and any(
            dotted_name(t) == counter for t in walk(sub.target)
        ):
            return False
    return True


def _every_step(test: ast.expr, ctx: Context) -> bool:
    """``step % log_interval == 0`` with ``log_interval = 1`` the only binding of the name (in
    the function, or else in the module): a modulo by one holds on every step."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.left, ast.BinOp)
        and isinstance(test.left.op, ast.Mod)
        and isinstance(test.left.right, ast.Name)
    ):
        return False
    right = test.comparators[0]
    if not (isinstance(right, ast.Constant) and right.value == 0):
        return False
    name = test.left.right.id
    function = ctx.function_scope()
    values = ctx.scope_bindings(function).get(name) if function is not None else None
    if values is None:
        values = ctx.scope_bindings(ctx.scope.root()).get(name) or []
    return bool(values) and all(
        isinstance(value, ast.Constant) and type(value.value) is int and value.value == 1
        for value in values
    )


def _fixed_setting(test: ast.expr, ctx: Context) -> bool:
    """``if net.n_classes == 1:``, ``if n_heads < 4:``: a comparison with a small constant of a
    value no enclosing loop rebinds is a setting, the same on every step (all of them or none),
    not a step counter's ``if i == 0:``. ``self.step == 0`` is left rare: another method may
    count on ``self``."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, (ast.Name, ast.Attribute))
        and isinstance(test.comparators[0], ast.Constant)
    ):
        return False
    # `if self.logger == "tensorboard":` picks a backend by its name: a setting whatever the
    # names say (a step counter is never a string)
    named = isinstance(test.comparators[0].value, str)
    if not named and rare_test(test.left):
        return False
    root = dotted_name(test.left)
    if root is None or (root.split(".", 1)[0] == "self" and not named):
        return False
    loops = [p for p in ctx.parents if isinstance(p, (ast.For, ast.AsyncFor, ast.While))]
    return bool(loops) and not any(
        root.split(".", 1)[0] in loop_bound_names(loop, ctx) for loop in loops
    )


def _loop_nodes(loop: ast.AST) -> list[ast.AST]:
    """A loop's body (a comprehension: itself), not entering nested scopes."""
    body = loop.body if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) else [loop]
    return list(walk_body(body))


def loop_bound_names(loop: ast.AST, ctx: Context) -> set[str]:
    """Names that change from one step of a loop to the next (targets and assignments)."""
    key = f"loop-names:{id(loop)}"
    cached: set[str] | None = ctx.scope.cache.get(key)
    if cached is not None:
        return cached
    names: set[str] = set()
    targets: list[ast.AST] = []
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        targets.append(loop.target)
    elif isinstance(loop, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        targets.extend(gen.target for gen in loop.generators)
    for sub in _loop_nodes(loop):
        if isinstance(sub, ast.Assign):
            targets.extend(sub.targets)
        elif isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            targets.append(sub.target)
        elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
            targets.append(sub.optional_vars)
        elif isinstance(sub, ast.comprehension):
            targets.append(sub.target)
    for target in targets:
        names |= names_in(target)
    ctx.scope.cache[key] = names
    return names


def only_used_by(name: str, ctx: Context, user: Callable[[ast.stmt], bool]) -> bool:
    """Every module-level statement of the file that names ``name`` (its own ``def`` aside) is
    one ``user`` accepts, and there is one: a helper used only by dataset code, say."""
    users = [
        stmt
        for stmt in _module_users(ctx).get(name, ())
        if not (isinstance(stmt, ast.FunctionDef) and stmt.name == name)
    ]
    return bool(users) and all(user(stmt) for stmt in users)


def _module_users(ctx: Context) -> dict[str, list[ast.stmt]]:
    """Each name the file's module-level statements mention -> those statements, in order
    (built once per file: asked for every helper a rule looks at, it walked the file each
    time)."""
    root = ctx.scope.root()
    index: dict[str, list[ast.stmt]] | None = root.cache.get("module-users")
    if index is None:
        index = {}
        for stmt in getattr(root.node, "body", []):
            for named in dict.fromkeys(n.id for n in walk(stmt) if isinstance(n, ast.Name)):
                index.setdefault(named, []).append(stmt)
        root.cache["module-users"] = index
    return index


def is_env_step(call: ast.Call) -> bool:
    """``env.step(action)``, ``self.envs.step(a)``: the Gym-style call that advances an
    environment (not ``optimizer.step()`` or ``scheduler.step()``)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "step" and call.args):
        return False
    receiver = dotted_name(func.value)
    return receiver is not None and "env" in receiver.rpartition(".")[2].lower()


def old_loss_read(node: ast.Subscript, ctx: Context) -> ast.expr | None:
    """The loss of ``loss.data[0]``: before PyTorch 0.4 a loss was a one-element tensor and
    indexing its ``.data`` was how its value was read (what ``.item()`` is now), a wait for the
    device. Only of a loss by its name or its making (``criterion(out, y)``, a
    ``sum()``/``mean()``): the ``.data[0]`` of a batch is its first row, a tensor."""
    value = node.value
    if (
        isinstance(node.ctx, ast.Load)
        and isinstance(value, ast.Attribute)
        and value.attr == "data"
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) is int
        and _a_loss(value.value, ctx)
    ):
        return value.value
    return None


_REDUCED = frozenset({"sum", "mean", "norm"})


def _a_loss(node: ast.expr, ctx: Context) -> bool:
    """A loss by its name (``loss``, ``self.cls_loss``), or a name bound only to a loss
    function's result or a reduction (``kl = (p - q).pow(2).mean()``)."""
    if isinstance(node, ast.Call):  # `F.nll_loss(output, target).data[0]`
        return _makes_loss(node)
    if isinstance(node, ast.Subscript):  # `losses[name].data[0]`: an entry of a map of losses
        node = node.value
    name = dotted_name(node)
    if name is None:
        return False
    if "loss" in name.rpartition(".")[2].lower():
        return True
    if not isinstance(node, ast.Name):
        return False
    scope = ctx.function_scope() or ctx.scope.root()
    values = ctx.scope_bindings(scope).get(node.id, [])
    return bool(values) and all(isinstance(v, ast.Call) and _makes_loss(v) for v in values)


def _makes_loss(call: ast.Call) -> bool:
    """``criterion(out, y)``, ``F.nll_loss(...)``, ``F.cross_entropy(...)``, ``x.sum()``: a
    loss, or a reduction."""
    name = (call_name(call) or "").lower()
    return any(word in name for word in _LOSS_WORDS) or name in _REDUCED


_LOSS_WORDS = ("loss", "criterion", "entropy", "kl_div")
