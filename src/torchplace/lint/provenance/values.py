"""What an expression says by its shape: the :class:`Fact` of where a value lives, the
vocabulary of host and device calls (moves, factories, host reads, device helpers), and how facts
combine (arithmetic, containers, either branch).

Nothing here follows names through a function (that is :mod:`.flow`); each helper reads one node.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from torchplace.lint.base import bindings
from torchplace.lint.nodes import kept, own_nodes, walk
from torchplace.lint.resolver import dotted_name

__all__ = [
    "HOST_ATTRS",
    "HOST_METHODS",
    "METADATA_ATTRS",
    "Fact",
    "LoopKind",
    "closure_step",
    "inherited_cpu_names",
    "is_device_expr",
    "is_text",
    "moved_in_place",
    "moves_to_device",
    "reads_learning_rate",
]

Where = Literal["device", "host"]
LoopKind = Literal["batch", "rows", "items"]
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# Methods whose result lives on the host whatever the receiver (reads, shapes, metadata).
HOST_METHODS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "get_device",
        "data_ptr",
        "element_size",
        "stride",
        "is_contiguous",
        "is_floating_point",
        "storage_offset",
        "keys",
        "train",
        "eval",
        "zero_grad",
        "backward",
        "step",
        "register_buffer",
        "append",
        "extend",
        "update",
        "add_scalar",
        "log",
        "get_last_lr",  # a learning-rate scheduler's rates: Python floats
        "load_state_dict",  # the missing and unexpected keys: lists of names
        # string methods a tensor lacks (`end_pos = response["text"].find(sep)`): Python values
        *("find", "rfind", "startswith", "endswith", "strip", "rstrip", "lstrip"),
        *("replace", "lower", "upper", "title", "capitalize", "casefold", "zfill", "splitlines"),
    }
)
HOST_ATTRS = frozenset(
    {
        "shape",
        "device",
        "dtype",
        "ndim",
        "is_cuda",
        "requires_grad",
        "layout",
        "training",
        "type",
        "index",
        "name",
        "columns",  # a DataFrame's column labels: tensors have no such attribute
        # a model's settings (`model.hyperparams["burn_in"]`, `model.config.vocab_size`)
        "hyperparams",
        "hparams",
        "config",
        "cfg",
    }
)
# A MONAI MetaTensor's metadata (`img.meta["filename_or_obj"]`): Python values. Only of a
# value: a module's own `self.meta` may be any tensor it stores.
METADATA_ATTRS = frozenset({"meta", "_meta"})
# Methods of a tokenizer or processor (by the receiver's name) that turn token ids into text:
# Python strings, whatever device the ids are on.
TEXT_METHODS = frozenset(
    {"decode", "batch_decode", "detokenize", "convert_ids_to_tokens", "string"}
)
_TEXT_OWNERS = ("tokenizer", "processor")
# Words that name a vocabulary (fairseq's ``tgt_dict.string(ids)``, ``vocab.decode(ids)``).
_VOCAB_WORDS = frozenset({"dict", "dictionary", "vocab", "vocabulary"})
# Builtins and modules whose results live on the host.
_HOST_CALLS = frozenset(
    {"float", "int", "bool", "str", "len", "round", "isinstance", "range", "repr", "print"}
)
_HOST_ROOTS = frozenset({"numpy", "math", "random", "time", "os", "json", "pandas", "PIL"})
# The last word of a function named for what it hands back on the host: a loader or dataset
# (whose batches are host data until moved), a count (`create_dataloader(..., batch_size)`,
# `check_train_batch_size(model, imgsz)`), whatever device values it is given.
_HOST_RESULT_WORDS = frozenset({"loader", "dataloader", "loaders", "dataset", "datasets", "count"})


def names_host_result(name: str) -> bool:
    """``create_dataloader``, ``build_dataset``, ``check_train_batch_size``: a function whose
    name says it returns a loader, a dataset, a count or a batch size."""
    lowered = name.lower()
    return lowered.rsplit("_", 1)[-1] in _HOST_RESULT_WORDS or lowered.endswith("batch_size")


_FOLLOW_CALLS = frozenset(
    {"sum", "max", "min", "abs", "list", "tuple", "zip", "enumerate", "reversed", "sorted", "iter"}
)
#: torch factories that allocate a new tensor (on the CPU unless given ``device=``); the
#: rules' own list (``rules.facts.FACTORIES``) is built on it
FACTORY_NAMES = frozenset(
    (
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "tensor",
        "rand",
        "randn",
        "randint",
        "randperm",
        "eye",
        "linspace",
        "logspace",
    )
)
_FACTORIES = FACTORY_NAMES | frozenset(
    (
        "as_tensor",
        "from_numpy",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
    )
)


@dataclass(frozen=True, slots=True)
class Fact:
    """Where a value lives, and why we think so.

    ``name`` is the variable it was read from (if any), ``source`` the text it was computed
    from, ``move`` the evidence at its root (``"`data` moved to `device` at line 41"``), and
    ``direct`` whether ``source`` is that move itself.
    """

    where: Where
    source: str
    move: str | None = None
    name: str | None = None
    direct: bool = False
    many: bool = False  # a list or tuple of such values (iterating it yields one each)
    # a tensor or array copied to the host (`x.cpu()`, `x.cpu().numpy()`, `.to("cpu")`): its
    # arithmetic with a value of unknown place stays on the host (a host tensor cannot meet a
    # device one, so the other operand is a number or on the host too)
    copy: bool = False
    # keys of a mapping whose other items a loop moved in place (`for k in batch: if k !=
    # "meta": batch[k] = batch[k].to(d)`): their items stay on the host
    kept: frozenset[str] = frozenset()

    @property
    def on_device(self) -> bool:
        return self.where == "device"

    @property
    def moved(self) -> bool:
        """On the device by a move, a factory given a device, or a run of a moved model (not
        only because a device was passed to some helper)."""
        return self.on_device and self.move is not None and not self.move.startswith("placed by")

    def describe(self) -> str:
        """``"`loss` comes from `model(data)`, `model` moved to `device` at line 58"``."""
        if self.name is not None and self.direct and self.move is not None:
            return self.move
        subject = f"`{self.name}` comes from `{self.source}`" if self.name else f"`{self.source}`"
        if self.move is None:
            return subject + (" is on the device" if not self.name else "")
        return f"{subject}, {self.move}" if self.name else f"{subject}: {self.move}"


def _short(text: str | None, limit: int = 48) -> str:
    text = " ".join((text or "?").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closure_step(call: ast.Call, defs: Mapping[str, object]) -> bool:
    """``optimizer.step(closure)`` (LBFGS's form): a ``step`` handed the function that
    recomputes the loss and its gradients, a lambda, a function of the file (``defs``) or a
    name for a closure; it returns that loss."""
    func = call.func
    given = [*call.args, *(k.value for k in call.keywords if k.arg == "closure")]
    if not (isinstance(func, ast.Attribute) and func.attr == "step" and len(given) == 1):
        return False
    arg = given[0]
    return isinstance(arg, ast.Lambda) or (
        isinstance(arg, ast.Name) and (arg.id in defs or "closure" in arg.id.lower())
    )


def is_text(node: ast.expr) -> bool:
    """A string by its form: a string literal or f-string, formatted with ``%`` (``"%g " %
    n``), joined or repeated (``"a" + name``, ``"%g " * 5``), also trimmed by a string method
    (``("%g " * len(line)).rstrip()``, YOLO's label lines)."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return is_text(node.left)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        return is_text(node.left) or is_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in _TRIMS and is_text(node.func.value)
    return False


# String methods that hand back the text they trim: a format string stays one.
_TRIMS = frozenset({"strip", "rstrip", "lstrip"})


def moves_to_device(call: ast.Call, qualname: object = None) -> bool:
    """Whether a ``.to(...)``/``.cuda(...)`` call changes device (not only the dtype).

    ``qualname`` resolves an expression to its imported dotted name (a callable), so that
    ``.to(torch.float16)`` reads as a dtype.
    """
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "cuda":
        return True
    if func.attr != "to":
        return False
    if any(kw.arg == "device" for kw in call.keywords):
        return True
    if not call.args:
        return False
    first = call.args[0]
    name = qualname(first) if callable(qualname) else dotted_name(first)
    if isinstance(name, str) and name.startswith("torch.") and not name.startswith("torch.device"):
        return False  # torch.float16 and friends: a dtype
    if isinstance(first, ast.Attribute) and "dtype" in first.attr:
        return False
    if isinstance(first, ast.Name) and ("dtype" in first.id or first.id in _PYTHON_TYPES):
        return False  # `x.to(int)`: a cast to the dtype torch maps Python's type to
    return not (isinstance(first, ast.Constant) and not isinstance(first.value, str))


# Python's number types, which `Tensor.to` takes as dtypes (`done.to(int)` is `torch.int64`).
_PYTHON_TYPES = frozenset({"int", "float", "bool", "complex"})


def _device_target(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    for kw in call.keywords:
        if kw.arg == "device":
            return kw.value
    return None


def _is_cpu(node: ast.expr | None) -> bool:
    """``"cpu"``, ``torch.device("cpu")``, or a variable named for the CPU (``cpu_device``,
    ``self._cpu_device``): a move there is a copy to the host, not to an accelerator."""
    if isinstance(node, ast.Constant):
        return node.value == "cpu"
    if isinstance(node, ast.Call) and node.args:  # torch.device("cpu")
        return _is_cpu(node.args[0])
    text = dotted_name(node) if node is not None else None
    if text is None:
        return False
    words = text.rsplit(".", 1)[-1].lower().split("_")
    return "cpu" in words and not {"gpu", "cuda", "or", "if"} & set(words)


def cpu_names(node: ast.AST) -> frozenset[str]:
    """Names a function binds only to the CPU (``eval_device = "cpu"``, never rebound, not a
    parameter): ``x.to(eval_device)`` is then a copy to the host, as ``x.to("cpu")`` is."""
    values: dict[str, list[ast.expr | None]] = {}
    for sub in own_nodes(node):
        if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
            target = sub.targets[0]
            if isinstance(target, ast.Name):
                values.setdefault(target.id, []).append(sub.value)
                continue
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.withitem)):
            for name in _bound_names(sub):
                values.setdefault(name, []).append(None)
    args = getattr(node, "args", None)
    params = {a.arg for a in walk(args) if isinstance(a, ast.arg)} if args else set()
    return frozenset(
        name
        for name, found in values.items()
        if name not in params and all(v is not None and _is_cpu(v) for v in found)
    )


def inherited_cpu_names(function: ast.AST, module: ast.Module) -> frozenset[str]:
    """Names the module binds only to the CPU (theseus' ``device = "cpu"``) that ``function``
    neither binds nor takes as a parameter: there they still hold the CPU."""
    if function is module:
        return frozenset()
    found = kept("cpu-names", module, cpu_names)
    if not found:
        return found
    args = getattr(function, "args", None)
    bound = {a.arg for a in walk(args) if isinstance(a, ast.arg)} if args else set()
    for sub in own_nodes(function):
        bound |= _bound_names(sub)
        if isinstance(sub, ast.NamedExpr):
            bound.add(sub.target.id)
        if isinstance(sub, ast.Global):
            bound |= set(sub.names)
    return found - bound


def _bound_names(node: ast.AST) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    return {sub.id for target in targets for sub in walk(target) if isinstance(sub, ast.Name)}


def is_device_expr(node: ast.expr) -> bool:
    """A name that holds a device by what it is called: ``device``, ``args.device``, ``rank``."""
    text = dotted_name(node)
    if text is None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.split(":")[0] in {"cuda", "mps", "xpu", "hpu", "npu"}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr in {"device", "current_device", "dev", "get_device"}
        return False
    last = text.rsplit(".", 1)[-1].lower()
    return "device" in last or last in {"gpu", "rank", "local_rank", "gpu_id", "dev"}


def _target_names(target: ast.expr) -> list[str]:
    return [n.id for n in walk(target) if isinstance(n, ast.Name)]


def _places_self(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method that may put a ``self.`` attribute on a device: it moves, runs or builds on
    a device somewhere (checked on the statements' text-free structure, no flow needed)."""
    for sub in walk(method):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in {"to", "cuda"}:
                return True
            if any(kw.arg == "device" for kw in sub.keywords):
                return True
    return False


def _plainly_host(value: ast.expr) -> bool:
    """``loss.item()``, ``float(x)``, ``x.tolist()``, a literal, an f-string: host, whatever
    ``x`` is."""
    if isinstance(value, (ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(_plainly_host(e) for e in value.elts)
    if isinstance(value, ast.BinOp):
        return _plainly_host(value.left) and _plainly_host(value.right)
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute):
            return func.attr in {"item", "tolist", "numpy"}
        return isinstance(func, ast.Name) and func.id in {"float", "int", "bool", "len", "str"}
    return False


def _iterates_items(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "items"
    )


def iterates_keys(iterable: ast.expr, scope: ast.AST) -> bool:
    """``for k in d.keys()``, ``for n in {n: m for ...}``, or ``for name in subset`` with
    ``subset`` bound in ``scope`` only to a dict display or comprehension: iterating a mapping
    yields its keys (names, indices), never the tensors it holds."""
    if isinstance(iterable, (ast.Dict, ast.DictComp)):
        return True
    if isinstance(iterable, ast.Call):
        func = iterable.func
        return isinstance(func, ast.Attribute) and func.attr == "keys" and not iterable.args
    if not isinstance(iterable, ast.Name):
        return False
    values = bindings(scope).get(iterable.id, [])
    return bool(values) and all(isinstance(v, (ast.Dict, ast.DictComp)) for v in values)


def looks_up_keys(loop: ast.AST, scope: ast.AST) -> bool:
    """``for name in subset: ... subset[name] ...`` (GPTQ's walk over ``find_layers(layer)``):
    a loop whose body indexes what it iterates by its own target walks a mapping's keys (the
    layer names), never a tensor's rows (a row does not index the tensor it came from); so
    does any other loop of ``scope`` over the same name (``for name in subset: print(name)``
    after the first)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Name):
        return False
    walked = dotted_name(loop.iter)
    if walked is None:
        return False
    keyed = _KEYED.get(scope)
    if keyed is None:
        keyed = _KEYED[scope] = frozenset(
            name
            for other in walk(scope)
            if isinstance(other, (ast.For, ast.AsyncFor))
            and isinstance(other.target, ast.Name)
            and (name := dotted_name(other.iter)) is not None
            and _indexes_by_target(other, name, other.target.id)
        )
    return walked in keyed


# scope -> the names its loops walk as mappings (`for name in subset: subset[name]`)
_KEYED: weakref.WeakKeyDictionary[ast.AST, frozenset[str]] = weakref.WeakKeyDictionary()


def _indexes_by_target(loop: ast.For | ast.AsyncFor, walked: str, key: str) -> bool:
    """The body of ``loop`` reads ``walked[key]``, ``key`` being its own target."""
    return any(
        isinstance(sub, ast.Subscript)
        and isinstance(sub.slice, ast.Name)
        and sub.slice.id == key
        and dotted_name(sub.value) == walked
        for stmt in loop.body
        for sub in walk(stmt)
    )


def _decodes_text(func: ast.Attribute) -> bool:
    """``tokenizer.decode(ids)``, ``self.processor.batch_decode(out)``, a vocabulary's
    ``self.task.source_dictionary.string(ids)``: text, not tensors (``vae.decode(z)`` is a
    model's decoder and gives a tensor)."""
    owner = (dotted_name(func.value) or "").rsplit(".", 1)[-1].lower()
    return func.attr in TEXT_METHODS and (
        any(word in owner for word in _TEXT_OWNERS) or bool(_VOCAB_WORDS & set(owner.split("_")))
    )


def reads_learning_rate(func: ast.Attribute) -> bool:
    """``lr_scheduler.get_epoch_values(epoch)``, ``self.lr_sched.get_lr()``: a learning-rate
    scheduler's getters answer Python floats (a diffusion ``noise_scheduler`` is not one)."""
    owner = (dotted_name(func.value) or "").rsplit(".", 1)[-1].lower()
    return func.attr.startswith("get_") and "lr" in owner.split("_") and "sched" in owner


def _is_move_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in {"to", "cuda"}


def in_place_helper(call: ast.Call) -> tuple[ast.Name, ast.expr] | None:
    """``(batch, device)`` of a statement ``utils.batch_to_device(batch, device)``: a helper
    named for moving to a device, called for its effect with a name and a device (as
    ``device=`` too), moves what the name holds in place (its result is dropped)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if not name.lower().endswith(("to_device", "to_cuda", "to_gpu")):
        return None
    given = next((kw.value for kw in call.keywords if kw.arg == "device"), None)
    device = call.args[1] if len(call.args) > 1 else given
    if not call.args or not isinstance(call.args[0], ast.Name) or device is None:
        return None
    return call.args[0], device


def moved_in_place(target: ast.expr, value: ast.expr) -> ast.expr | None:
    """The container of ``batch[key] = batch[key].to(device)``: an item replaced by its own
    move (same subscript on both sides), which leaves the container's items on the device.
    None for anything else (``out[m] = x.to(d)`` copies into ``out``, whatever it is)."""
    if not (
        isinstance(target, ast.Subscript)
        and isinstance(value, ast.Call)
        and _is_move_call(value)
        and isinstance(value.func, ast.Attribute)
        and isinstance(value.func.value, ast.Subscript)
    ):
        return None
    source = value.func.value
    if ast.unparse(source) != ast.unparse(target) or dotted_name(target.value) is None:
        return None
    return target.value


def _device_helper(name: str, args: list[ast.expr]) -> bool:
    """``to_device(batch, device)``, ``move_to_cuda(x)``: a project's own transfer helper;
    also a bare ``to_device(x)`` (Lightning Fabric's ``fabric.to_device(batch)``), whose name
    says it moves to the device its owner was set up with."""
    lowered = name.lower()
    if not any(word in lowered for word in ("device", "cuda", "gpu")):
        return False
    if lowered.startswith(("get_", "is_", "set_", "init", "setup")) or "cpu" in lowered:
        return False
    if lowered == "device":  # `torch.device(...)`, `with torch.cuda.device(v.device):` select
        return False
    return bool(args) and (
        "cuda" in lowered
        or "gpu" in lowered
        or lowered in {"to_device", "move_to_device"}
        or any(is_device_expr(arg) for arg in args)
    )


def _ran(model: Fact) -> str | None:
    """The evidence for the output of running a model that is on the device."""
    if model.move is not None and model.move.startswith("placed by"):
        return f"the model was {model.move}"
    return model.move


def _passes_device(call: ast.Call) -> bool:
    """``make_steps(n, device)``, ``sample(shape, device=dev)``: built where it is told."""
    name = (dotted_name(call.func) or "").rsplit(".", 1)[-1].lower()
    if name.startswith(("get_device", "is_", "set_", "init", "setup", "print", "log")):
        return False
    if "cpu" in name or name in {"device", "dev", "str", "repr", "print"}:
        return False
    return any(kw.arg == "device" and not _is_cpu(kw.value) for kw in call.keywords) or any(
        _names_device(arg) for arg in call.args
    )


def _names_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"dev", "device"} and not node.args
    text = dotted_name(node)
    if text is None:
        return False
    last = text.rsplit(".", 1)[-1].lower()
    return last == "dev" or ("device" in last and not last.endswith(("type", "s", "_id")))


def _moved_by(call: ast.Call) -> str:
    name = dotted_name(call.func) or "a helper"
    return f"placed by `{name}(...)` at line {call.lineno}"


def _many(fact: Fact | None) -> Fact | None:
    if fact is None or fact.many:
        return fact
    return replace(fact, many=True)


def _one(fact: Fact | None) -> Fact | None:
    if fact is None or not fact.many:
        return fact
    return replace(fact, many=False)


def _join(a: Fact | None, b: Fact | None) -> Fact | None:
    if a is not None and a.on_device:
        return a
    if b is not None and b.on_device:
        return b
    if a is not None and b is not None:
        return a
    # `boxes = boxes.cpu()`, then `boxes /= scale`: a host copy's arithmetic stays on the host
    # whatever the other operand is (a device tensor would raise there)
    copied = a if a is not None else b
    return copied if copied is not None and copied.copy else None


def _either(a: Fact | None, b: Fact | None) -> Fact | None:
    if a is not None and a.on_device:
        return a
    if b is not None and b.on_device:
        return b
    return a if a is not None and b is not None else None


def _any_device(facts: list[Fact | None]) -> Fact | None:
    for fact in facts:
        if fact is not None and fact.on_device:
            return fact
    if facts and all(f is not None for f in facts):
        return facts[0]
    return None


def _cut(line: str, start: int, end: int | None) -> str:
    if line.isascii():
        return line[start:end]
    return line.encode("utf-8")[start:end].decode("utf-8", "replace")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}
