"""TPL103's second path: a tensor factory, in any function, built to match a tensor parameter
``x`` of that function (``dtype=x.dtype``, or its result combined with ``x``) but allocated on
the default device: :func:`matched_to_parameter` finds the parameter, or None. Functions about
host data (datasets, collate functions, numpy conversions, loading), module constructors,
placement overrides and files that set the default device are left alone. In a method of an
``nn.Module``, the module's own parameters, and what its methods build only from them, are on
its device too: :func:`meets_device_tensor` says whether the factory meets one of them.
"""

from __future__ import annotations

import ast
from typing import Literal

from torchplace.lint.base import (
    Context,
    Scope,
    assigned_name,
    call_name,
    keyword,
    unpacked_pairs,
)
from torchplace.lint.nodes import children, subtree, walk
from torchplace.lint.provenance.loops import counter_names
from torchplace.lint.provenance.values import FACTORY_NAMES
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import (
    FACTORIES,
    PLACEMENT_API,
    is_tensor_annotation,
    only_used_by,
)
from torchplace.lint.rules.module_helpers import construction_only

__all__ = ["COMBINERS", "HOST_CASTS", "matched_to_parameter", "meets_device_tensor"]

# torch functions whose result holds their tensor arguments: where the result goes, they go.
# Also the reshapes of one tensor (``rearrange(torch.arange(n), "t -> () t").to(x.device)``
# places the factory's values with the view).
COMBINERS = frozenset(
    {
        "torch.cat",
        "torch.concat",
        "torch.concatenate",
        "torch.stack",
        "torch.hstack",
        "torch.vstack",
        "torch.reshape",
        "torch.flatten",
        "torch.squeeze",
        "torch.unsqueeze",
        "torch.transpose",
        "torch.permute",
        "torch.flip",
        "torch.tile",
        "torch.nn.functional.one_hot",
        "einops.rearrange",
        "einops.repeat",
    }
)


#: casts and calls whose result is a host value
HOST_CASTS = frozenset({"int", "float", "bool", "round", "len", "range"})

# Functions about host data: a dataset's items, a collate function, numpy conversions, loading.
_HOST_FUNCTION_WORDS = (
    "collate",
    "numpy",
    "getitem",
    "dataset",
    "loader",
    "load",
    "read",
    "get_batch",
)
_HOST_CLASS_WORDS = ("dataset", "sampler", "dataloader", "datamodule", "collat")
# Tensor methods and attributes whose result is not a tensor of the receiver's device.
_NOT_TENSOR = frozenset(
    {
        "shape",
        "size",
        "dim",
        "ndim",
        "ndimension",
        "numel",
        "nelement",
        "item",
        "tolist",
        "numpy",
        "cpu",
        "dtype",
        "device",
        "stride",
        "data_ptr",
        "element_size",
        "get_device",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "requires_grad",
        "is_cuda",
    }
)
# Uses of a parameter that only a tensor has (a numpy array or a number has none of them).
_TENSOR_ONLY = frozenset(
    {
        "device",
        "is_cuda",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "new_tensor",
        "unsqueeze",
        "masked_fill",
        "masked_fill_",
        "type_as",
        "dim",
        "size",
        "detach",
        "contiguous",
        "permute",
    }
)
# torch functions whose tensor arguments must share a device.
_JOINERS = COMBINERS | frozenset(
    {"torch.where", "torch.maximum", "torch.minimum", "torch.matmul", "torch.bmm", "torch.mm"}
    # an index handed to a gather is copied to its source's device on every call
    | {"torch.index_select", "torch.gather", "torch.take_along_dim", "torch.take"}
)
# The same gathers as methods of their source, `x.index_select(0, torch.linspace(...))`.
_GATHERS = frozenset({"index_select", "gather", "take_along_dim", "take"})


def matched_to_parameter(call: ast.Call, ctx: Context) -> tuple[Scope, str, str] | None:
    """``torch.zeros(n, dtype=x.dtype)`` or ``x + torch.arange(n)`` with ``x`` a tensor
    parameter of the enclosing function: the factory is meant to match ``x`` (its dtype is
    copied, or it meets ``x`` in an op), yet lands on the CPU when ``x`` is on a GPU."""
    scope = ctx.function_scope()
    if scope is None or scope.name in PLACEMENT_API:  # placing is an override's job
        return None
    if scope.cls is not None and scope.cls.is_module_class and _constructing(scope):
        return None  # a module's parameters are built on the CPU and moved with it
    if _documentation(ctx):
        return None
    params, tensors = _candidates(scope, ctx)
    placed = _placed(scope, ctx) | _module_tensors(scope)
    if not params and not placed:
        return None
    if _cpu_path(call, scope):
        return None  # `if x.is_cuda: ... else: torch.zeros(n)`: built only for a CPU tensor
    dtype = keyword(call, "dtype")
    if (
        dtype is not None
        and isinstance(dtype.value, ast.Attribute)
        and dtype.value.attr == "dtype"
        and isinstance(dtype.value.value, ast.Name)
        and dtype.value.value.id in params
        and _reaches_device(call, ctx, scope)
    ):
        return scope, dtype.value.value.id, "copies the dtype of"
    derived = {name for name, root in _derived(scope, ctx).items() if root in tensors}
    derived |= set(_derive(scope, _module_tensors(scope), "tpl103-derived-module"))
    derived |= set(_derive(scope, _placed(scope, ctx), "tpl103-derived-placed"))
    if tensors or placed:
        param = _combined_with(call, ctx, scope, tensors | placed | derived)
        if param is not None:
            return scope, param, "is combined with"
    return None


def _constructing(scope: Scope) -> bool:
    """``__init__``, or a helper only it runs (:func:`.module_helpers.construction_only`)."""
    return scope.name == "__init__" or construction_only(scope)


def meets_device_tensor(call: ast.Call, ctx: Context) -> bool:
    """The factory's tensor meets, before anything places it, a tensor known to be on the
    device: the module's own parameters and what is built from them
    (``torch.linspace(0, 1, n)[self.get_opacities() > 0.5]``). A later move of what the
    factory became (a host copy turned back into a tensor) comes too late."""
    scope = ctx.function_scope()
    if scope is None or scope.name in PLACEMENT_API or _documentation(ctx):
        return False
    if scope.cls is not None and scope.cls.is_module_class and _constructing(scope):
        return False
    device = _module_tensors(scope) | _moved_before(scope, ctx, call)
    if not device or _cpu_path(call, scope):
        return False
    # views of those (`m = mask[None].expand(b, n, n)`): keyed by the names, which depend on
    # where the factory is (a shared key handed back what another call's names derived)
    key = "tpl103-derived-device:" + ",".join(sorted(device))
    device |= set(_derive(scope, device, key))
    return _combined_with(call, ctx, scope, device) is not None


def _moved_before(scope: Scope, ctx: Context, call: ast.Call) -> set[str]:
    """Names of :func:`_placed` that the function binds only to moved tensors, the first time
    in a statement before ``call`` (``z_idx = z.flatten().to(self.device)``, then
    ``torch.linspace(a, b, n)[z_idx]``): on the device already where the factory meets them,
    whatever moves the factory's result later."""
    placed = _placed(scope, ctx)
    if not placed:
        return set()
    first: dict[str, int] = {}
    other: set[str] = set()
    for sub in subtree(scope.node):
        for target, value in _bindings(sub):
            for name in _bare_names(target):
                if value is not None and _moved(value):
                    line = value.lineno
                    first[name] = min(first.get(name, line), line)
                else:
                    other.add(name)
    return {
        name
        for name, line in first.items()
        if name in placed and name not in other and line < call.lineno
    }


def _placed(scope: Scope, ctx: Context) -> set[str]:
    """Names and attributes the function itself binds to a tensor it moves to a device
    (``self.queue = torch.zeros(n, c).cuda()``, ``x = x.to(device)``): a factory that meets
    them is as foreign as one that meets a tensor parameter. Worked out once per scope."""
    cached: set[str] | None = scope.cache.get("tpl103-placed")
    if cached is not None:
        return cached
    found: set[str] = set()
    if not _file_facts(scope)[0] and not _host_function(scope, ctx):
        for sub in subtree(scope.node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                whole = (sub.targets[0], sub.value)
                for target, value in unpacked_pairs(*whole) or [whole]:
                    name = dotted_name(target) if _moved(value) else None
                    if name is not None:
                        found.add(name)
        found |= _joins_of_placed(scope, found)
        found |= _submodule_outputs(scope)
    scope.cache["tpl103-placed"] = found
    return found


_JOIN_CALLS = frozenset({"cat", "concat", "concatenate", "stack"})


def _joins_of_placed(scope: Scope, placed: set[str]) -> set[str]:
    """Names bound to a join of placed names only, ``all_inputs = torch.cat([x, u, u2])``."""
    found: set[str] = set()
    for sub in subtree(scope.node):
        if not (isinstance(sub, ast.Assign) and len(sub.targets) == 1):
            continue
        value, target = sub.value, sub.targets[0]
        if not (isinstance(value, ast.Call) and call_name(value) in _JOIN_CALLS and value.args):
            continue
        parts = value.args[0]
        if (
            isinstance(target, ast.Name)
            and isinstance(parts, (ast.List, ast.Tuple))
            and parts.elts
            and all(isinstance(e, ast.Name) and e.id in placed for e in parts.elts)
        ):
            found.add(target.id)
    return found


# Reads that turn a tensor into host data: what they give is not on the module's device.
_HOST_READS = frozenset({"item", "tolist", "cpu", "numpy", "size", "dim", "len", "int", "float"})


def _submodule_outputs(scope: Scope) -> set[str]:
    """In a method of an ``nn.Module``, names bound to what one of its ``torch.nn`` layers
    gives (``logits = self.net(x)``) and to tensor ops of those (``p = logits.softmax(-1)``):
    they live where the module lives, as a moved tensor does."""
    cls = scope.cls
    if cls is None or not cls.is_module_class or scope.name == "__init__":
        return set()
    layers = _torch_layers(cls)
    found: set[str] = set()
    for sub in sorted(subtree(scope.node), key=lambda n: getattr(n, "lineno", 0)):
        if not (
            isinstance(sub, ast.Assign)
            and len(sub.targets) == 1
            and isinstance(sub.targets[0], ast.Name)
        ):
            continue
        value = sub.value
        runs = (
            isinstance(value, ast.Call)
            and (dotted_name(value.func) or "").removeprefix("self.") in layers
        )
        if runs or (_names(value) & found and not _host_read(value)):
            found.add(sub.targets[0].id)
    return found


def _torch_layers(cls: Scope) -> set[str]:
    """Attributes ``__init__`` binds to a ``torch.nn`` layer (``self.net = nn.Sequential(...)``)."""
    layers: set[str] = set()
    for item in getattr(cls.node, "body", []):
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for sub in walk(item):
                if (
                    isinstance(sub, ast.Assign)
                    and len(sub.targets) == 1
                    and isinstance(sub.value, ast.Call)
                    and (dotted_name(sub.value.func) or "").startswith(("nn.", "torch.nn."))
                ):
                    name = dotted_name(sub.targets[0]) or ""
                    if name.startswith("self."):
                        layers.add(name.removeprefix("self."))
    return layers


def _names(node: ast.expr) -> set[str]:
    return {sub.id for sub in walk(node) if isinstance(sub, ast.Name)}


def _host_read(node: ast.expr) -> bool:
    """``x.item()``, ``int(x)``, ``len(x)``: the value itself is read back to the host."""
    return isinstance(node, ast.Call) and (call_name(node) or "") in _HOST_READS


def _moved(value: ast.expr) -> bool:
    """``t.cuda()``, ``t.to(device)``, ``t.to("cuda:0")``: a move to an accelerator, also
    followed by tensor methods and items that keep it there (``t.to(device).triu(1)``,
    ``t.cuda()[None]``; not a host read, ``t.cuda().tolist()``)."""
    while True:
        if isinstance(value, ast.Subscript):
            value = value.value
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr not in _NOT_TENSOR | {"to", "type", "cuda"}
        ):
            value = value.func.value
        else:
            break
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return False
    if value.func.attr == "cuda":
        return True
    if value.func.attr != "to":
        return False
    target = value.args[0] if value.args else getattr(keyword(value, "device"), "value", None)
    if isinstance(target, ast.Constant):
        return isinstance(target.value, str) and target.value.startswith("cuda")
    text = dotted_name(target) if target is not None else None
    return text is not None and "device" in text.lower()


def _candidates(scope: Scope, ctx: Context) -> tuple[set[str], set[str]]:
    """The parameters of a function scope a factory may be built to match, and those of them
    the function uses as only a tensor can be used (none in a function about host data, nor
    where the file sets the default device): worked out once per scope."""
    cached: tuple[set[str], set[str]] | None = scope.cache.get("tpl103-params")
    if cached is not None:
        return cached
    params = _candidates_params(scope, ctx)  # none where the file sets the default device
    result = params, {p for p in params if _tensor_evidence(scope, p, ctx)}
    scope.cache["tpl103-params"] = result
    return result


def _documentation(ctx: Context) -> bool:
    """A file under ``docs/``: it builds the documentation on the build host."""
    parts = ctx.path.replace("\\", "/").lower().split("/")[:-1]
    return any(part in {"doc", "docs"} for part in parts)


_SETS_DEFAULT = frozenset(
    {"set_default_device", "set_default_tensor_type", "set_default_dtype_and_device"}
)


def _file_facts(scope: Scope) -> tuple[bool, dict[str, set[str]]]:
    """Whether the file sets torch's default device, and, per function of the file, the
    parameters its callers in the file give a host tensor (``f(torch.from_numpy(a))``,
    ``f(x.cpu())``)."""
    root = scope.root()
    cached: tuple[bool, dict[str, set[str]]] | None = root.cache.get("tpl103-file")
    if cached is not None:
        return cached
    functions: dict[str, list[str]] = {}
    calls: list[ast.Call] = []
    defaults = False
    for node in walk(root.node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args]
            names = [a.arg for a in args]
            if names and names[0] in {"self", "cls"}:
                names = names[1:]
            functions.setdefault(node.name, names + [a.arg for a in node.args.kwonlyargs])
        elif isinstance(node, ast.Call):
            calls.append(node)
            defaults = defaults or call_name(node) in _SETS_DEFAULT
    host: dict[str, set[str]] = {}
    for call in calls:
        name = call_name(call)
        if name is None or name not in functions:
            continue
        params = functions[name]
        for index, arg in enumerate(call.args):
            if index < len(params) and _host_value(arg):
                host.setdefault(name, set()).add(params[index])
        for kw in call.keywords:
            if kw.arg is not None and _host_value(kw.value):
                host.setdefault(name, set()).add(kw.arg)
    for node in walk(root.node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init__":
            for name, param in _given_host_parameters(node, functions):
                host.setdefault(name, set()).add(param)
    result = (defaults, host)
    root.cache["tpl103-file"] = result
    return result


def _given_host_parameters(
    init: ast.FunctionDef | ast.AsyncFunctionDef, functions: dict[str, list[str]]
) -> list[tuple[str, str]]:
    """(function, parameter) pairs where a module's ``__init__`` hands a function of the file
    the parameter it has just built on the host: ``self.weight = Parameter(torch.empty(o, i))``,
    then ``_initialize_affine_weight(self.weight, ...)`` (Megatron-style model-parallel
    layers): the module is built on the CPU and moved as a whole afterwards."""
    bindings = sorted(
        (stmt.lineno, text, _built_on_host(stmt.value))
        for stmt in walk(init)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        for text in [dotted_name(stmt.targets[0])]
        if text is not None and text.startswith("self.")
    )
    pairs: list[tuple[str, str]] = []
    for call in walk(init):
        name = call_name(call) if isinstance(call, ast.Call) else None
        if not isinstance(call, ast.Call) or name is None or name not in functions:
            continue
        params = functions[name]
        for index, arg in enumerate(call.args[: len(params)]):
            text = dotted_name(arg)
            last = [host for line, bound, host in bindings if bound == text and line < call.lineno]
            if last and last[-1]:
                pairs.append((name, params[index]))
    return pairs


def _built_on_host(value: ast.expr) -> bool:
    """``Parameter(torch.empty(o, i))``, ``torch.zeros(n)``: a tensor made without a device."""
    if isinstance(value, ast.Call) and call_name(value) == "Parameter" and value.args:
        value = value.args[0]
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == "torch"
        and value.func.attr in _HOST_BUILDERS
        and keyword(value, "device") is None
    )


# Factories whose result is a fresh tensor on the default device.
_HOST_BUILDERS = frozenset(
    {"empty", "zeros", "ones", "rand", "randn", "full", "Tensor", "FloatTensor", "HalfTensor"}
)


def _host_value(node: ast.expr) -> bool:
    """``torch.from_numpy(a)``, ``torch.tensor(a)``, ``x.cpu()``, ``x.numpy()``: on the host."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    func = node.func
    if func.attr in {"cpu", "numpy"}:
        return True
    return (
        isinstance(func.value, ast.Name)
        and func.value.id == "torch"
        and func.attr in {"from_numpy", "tensor", "as_tensor"}
        and keyword(node, "device") is None
    )


def _parameters(scope: Scope, ctx: Context) -> set[str]:
    """Parameters that may be tensors and are never rebound to something else."""
    node = scope.node
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    if args and args[0].arg in {"self", "cls"} and scope.cls is not None:
        args = args[1:]
    rebound: dict[str, list[ast.expr | None]] = {}
    for sub in subtree(scope.node):  # `x = ...` (not `x[i] = ...`, which keeps x a tensor)
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                for name in _bare_names(target):
                    rebound.setdefault(name, []).append(sub.value)
        elif isinstance(sub, (ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr)):
            bound = sub.optional_vars if isinstance(sub, ast.withitem) else sub.target
            for name in _bare_names(bound):
                rebound.setdefault(name, []).append(None)
    found: set[str] = set()
    for arg in args:
        if arg.annotation is not None and not is_tensor_annotation(
            arg.annotation, ctx, optional=True
        ):
            continue
        if all(
            value is not None and _same_tensor(value, arg.arg) for value in rebound.get(arg.arg, [])
        ):
            found.add(arg.arg)
    return found


def _bare_names(target: ast.expr | None) -> list[str]:
    """Names a target binds as a whole: ``x``, ``x, y``; never ``x[i]`` or ``x.attr``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for elt in target.elts for name in _bare_names(elt)]
    if isinstance(target, ast.Starred):
        return _bare_names(target.value)
    return []


def _same_tensor(value: ast.expr, param: str) -> bool:
    """``x = x.float()``, ``x = x.view(-1)``: still the parameter's tensor, on its device
    (never ``x = torch.FloatTensor(x)``, a new tensor built from a list); also arithmetic on it,
    ``x = (x - mean) / std``, which runs where it is."""
    if isinstance(value, ast.BinOp):
        return _same_tensor(value.left, param) or _same_tensor(value.right, param)
    if isinstance(value, ast.UnaryOp):
        return _same_tensor(value.operand, param)
    if isinstance(value, ast.Name):
        return value.id == param
    if (  # `x = torch.where(ignore, -1, x)`, `x = torch.clamp(x, 0, 1)`: an op of x, not a new one
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == "torch"
        and value.func.attr not in _NOT_TENSOR
        and f"torch.{value.func.attr}" not in _BUILDERS
    ):
        return any(_same_tensor(arg, param) for arg in value.args)
    while isinstance(value, (ast.Call, ast.Subscript, ast.Attribute)):
        if isinstance(value, ast.Call):
            func = value.func
            if not isinstance(func, ast.Attribute) or func.attr in _NOT_TENSOR | {"to", "type"}:
                return False
            value = func.value
        else:
            value = value.value
        if isinstance(value, ast.Name):
            return value.id == param
    return False


def _tensor_evidence(scope: Scope, param: str, ctx: Context) -> bool:
    """The function uses ``param``, or a name it binds to tensor ops of ``param``, as only a
    tensor can be used (``x.unsqueeze(1)``, ``x.argmax(1, keepdim=True)``, ``m = x.argmax(1)``
    then ``m.unsqueeze(1)``), or names it for one (``tensor1``, ``input_tensor``)."""
    annotation = ctx.param_annotation(scope, param)
    if annotation is not None:
        return True  # kept by `_parameters`: annotated as a tensor
    if "tensor" in param.lower():
        return True  # `def add_padded(tensor1, tensor2):`: named for what it holds
    chains = _derive(scope, {param}, f"tpl103-chains-{param}", chain=True)
    names = {param, *chains}
    for sub in subtree(scope.node):
        if (
            isinstance(sub, ast.Attribute)
            and sub.attr in _TENSOR_ONLY
            and isinstance(sub.value, ast.Name)
            and sub.value.id in names
        ):
            return True
        if (  # `keepdim=` is torch's spelling (numpy's is `keepdims=`)
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id in names
            and keyword(sub, "keepdim") is not None
        ):
            return True
        if (
            isinstance(sub, ast.keyword)
            and sub.arg == "dtype"
            and isinstance(sub.value, ast.Attribute)
            and sub.value.attr == "dtype"
            and isinstance(sub.value.value, ast.Name)
            and sub.value.value.id == param
        ):
            return True
    return False


def _derived(scope: Scope, ctx: Context) -> dict[str, str]:
    """Names the function binds only to tensor ops of a parameter that may be a tensor
    (``max_preds = preds.argmax(1)``, then ``correct = max_preds.eq(y)``; also ``lo, hi =
    x.min(), x.max()``), each with that parameter: they live on its device. A name bound
    anywhere to something else (a host read, a new tensor, a loop variable) is none of them.
    Worked out once per scope."""
    return _derive(scope, _candidates_params(scope, ctx), "tpl103-derived")


def _derive(scope: Scope, known: set[str], key: str, *, chain: bool = False) -> dict[str, str]:
    """Names the function of ``scope`` binds only to tensor ops of ``known`` tensors (with
    ``chain``, only to methods and items of one, ``m = x.argmax(1)``), each with the tensor it
    comes from; cached under ``key``."""
    cached: dict[str, str] | None = scope.cache.get(key)
    if cached is not None:
        return cached
    result = _derive_in(scope.node, known, chain=chain) if known else {}
    scope.cache[key] = result
    return result


def _derive_in(function: ast.AST, known: set[str], *, chain: bool = False) -> dict[str, str]:
    found: dict[str, str] = {}
    other: set[str] = set()
    for sub in sorted(subtree(function), key=lambda n: getattr(n, "lineno", 0)):
        for target, value in _bindings(sub):
            for name in _bare_names(target):
                if value is None:
                    root = None
                elif chain:
                    root = _chain_root(value, known | set(found))
                else:
                    root = _tensor_of(value, known | set(found), built=False)
                if root is None or name in known:
                    other.add(name)
                else:
                    found.setdefault(name, found.get(root, root))
    return {name: root for name, root in found.items() if name not in other}


def _chain_root(value: ast.expr, known: set[str]) -> str | None:
    """``x.argmax(1, keepdim=True)``, ``m[i].squeeze(1)``: the known name a chain of tensor
    methods and items starts from (never a host read, a move, or an operation with another
    value, whose result may be that value's kind)."""
    node: ast.expr = value
    while True:
        if isinstance(node, ast.Name):
            return node.id if node.id in known else None
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr not in _NOT_TENSOR | {"to", "type"}
        ):
            node = node.func.value
        else:
            return None


def _module_tensors(scope: Scope) -> set[str]:
    """In a method of an ``nn.Module`` other than ``__init__``: the module's own parameters
    and buffers (``self.w``, bound to ``nn.Parameter(...)`` or registered with
    ``self.register_buffer("w", ...)`` in any of its methods), and what its methods and properties return when they
    return only tensor ops of those (``self.get_opacities()``, returning
    ``torch.sigmoid(self.alpha_logit)``): they live where the module lives, whatever host data
    the method also handles. Worked out once per class."""
    cls = scope.cls
    if cls is None or not cls.is_module_class or scope.name == "__init__":
        return set()
    cached: set[str] | None = cls.cache.get("tpl103-module-tensors")
    if cached is not None:
        return cached
    own = _own_parameters(cls)
    found = set(own)
    for item in getattr(cls.node, "body", []) if own else []:
        if not isinstance(item, ast.FunctionDef) or item.name == "__init__":
            continue
        returns = [r.value for r in walk(item) if isinstance(r, ast.Return)]
        local = own | set(_derive_in(item, own))
        if returns and all(v is not None and _tensor_of(v, local, built=False) for v in returns):
            decorators = {dotted_name(d) for d in item.decorator_list}
            if "property" in decorators:
                found.add(f"self.{item.name}")
            elif not decorators and len(item.args.args) == 1:
                found.add(f"self.{item.name}()")
    cls.cache["tpl103-module-tensors"] = found
    return found


def _own_parameters(cls: Scope) -> set[str]:
    """``self.w`` for each ``self.w = nn.Parameter(...)`` and ``self.register_buffer("w", ...)``
    of the class's methods (``__init__`` or a helper it calls: either registers them)."""
    found: set[str] = set()
    for item in getattr(cls.node, "body", []):
        if not isinstance(item, ast.FunctionDef):
            continue
        for sub in walk(item):
            if (
                isinstance(sub, ast.Call)
                and dotted_name(sub.func) == "self.register_buffer"
                and sub.args
                and isinstance(sub.args[0], ast.Constant)
                and isinstance(sub.args[0].value, str)
            ):
                found.add(f"self.{sub.args[0].value}")
        for sub in walk(item):
            if (
                isinstance(sub, ast.Assign)
                and len(sub.targets) == 1
                and isinstance(sub.value, ast.Call)
                and (dotted_name(sub.value.func) or "").split(".")[-1] == "Parameter"
                and (name := dotted_name(sub.targets[0])) is not None
                and name.startswith("self.")
                and name.count(".") == 1
            ):
                found.add(name)
    return found


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr | None]]:
    """What ``node`` binds to what: ``a = v``, ``a, b = v, w`` pairwise; a loop variable, a
    ``with`` target or a walrus to None (a value not followed)."""
    if isinstance(node, ast.Assign):
        pairs: list[tuple[ast.expr, ast.expr | None]] = []
        for target in node.targets:
            if (
                isinstance(target, ast.Tuple)
                and isinstance(node.value, ast.Tuple)
                and len(target.elts) == len(node.value.elts)
            ):
                pairs.extend(zip(target.elts, node.value.elts, strict=True))
            elif isinstance(target, (ast.Tuple, ast.List)):
                pairs.append((target, None))
            else:
                pairs.append((target, node.value))
        return pairs
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, None)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, None)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, None)]
    return []


def _candidates_params(scope: Scope, ctx: Context) -> set[str]:
    """The parameters ``_candidates`` starts from (before the evidence that they are tensors)."""
    defaults, host_calls = _file_facts(scope)
    if defaults or _host_function(scope, ctx):
        return set()
    return _parameters(scope, ctx) - host_calls.get(scope.name, set())


def _parent_map(scope: Scope) -> dict[int, ast.AST]:
    cached: dict[int, ast.AST] | None = scope.cache.get("tpl103-parents")
    if cached is None:
        cached = {}
        for node in subtree(scope.node):
            for child in children(node):
                cached[id(child)] = node
        scope.cache["tpl103-parents"] = cached
    return cached


def _host_function(scope: Scope, ctx: Context) -> bool:
    """A function about host data: a dataset's ``__getitem__``, a collate function, a numpy
    conversion, a loader; one that calls ``.numpy()`` or ``torch.from_numpy``."""
    outer: Scope | None = scope
    while outer is not None:  # also a helper nested in one (`get_batch`'s `pad_right`)
        if outer.kind == "function" and any(
            word in outer.name.lower() for word in _HOST_FUNCTION_WORDS
        ):
            return True
        if outer.kind == "class" and isinstance(outer.node, ast.ClassDef):
            text = " ".join(
                [outer.name, *(ctx.segment(base) or "" for base in outer.node.bases)]
            ).lower()
            if any(word in text for word in _HOST_CLASS_WORDS):
                return True
        outer = outer.parent
    calls = [sub for sub in subtree(scope.node) if isinstance(sub, ast.Call)]
    if not any(_to_a_tensors_device(call) for call in calls):
        # not one that places its own tensors where an input is (`.to(annotation.device)`,
        # then `show.cpu().numpy()` for a plot): it works on the device, then hands back NumPy
        for sub in calls:
            if isinstance(sub.func, ast.Attribute) and sub.func.attr == "numpy":
                return True
            if ctx.call_qualname(sub) in {"torch.from_numpy", "numpy.asarray", "numpy.array"}:
                return True
    if scope.parent is not None and scope.parent.kind == "module":
        return _serves_host_code(scope.name, scope.root().node, ctx, depth=2)
    return False


def _to_a_tensors_device(call: ast.Call) -> bool:
    """``t.to(x.device)``: a move to where another tensor lives."""
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "to"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Attribute)
        and call.args[0].attr == "device"
    )


def _serves_host_code(name: str, tree: ast.AST, ctx: Context, depth: int) -> bool:
    """A module-level function the file uses only in host-data code (``mix_samples(wav, ...)``
    called by a dataset's ``collater``), directly or through other such functions: it works
    on the CPU batch that code builds."""
    return only_used_by(name, ctx, lambda stmt: _host_user(stmt, tree, ctx, depth))


def _host_user(stmt: ast.stmt, tree: ast.AST, ctx: Context, depth: int) -> bool:
    if isinstance(stmt, ast.ClassDef):
        text = " ".join([stmt.name, *(ctx.segment(base) or "" for base in stmt.bases)])
        return any(word in text.lower() for word in _HOST_CLASS_WORDS)
    if isinstance(stmt, ast.FunctionDef):
        if any(word in stmt.name.lower() for word in _HOST_FUNCTION_WORDS):
            return True
        return depth > 0 and _serves_host_code(stmt.name, tree, ctx, depth - 1)
    return False  # the script's own body, or a longer chain of helpers


_Where = Literal["cpu", "cuda"] | None


def _device_test(test: ast.expr) -> tuple[_Where, _Where]:
    """What a test says of a tensor's device when it holds and when it fails: ``x.is_cuda``
    is ``("cuda", "cpu")``, ``x.device.type == "cpu"`` is ``("cpu", "cuda")`` (not the CPU
    counts as CUDA, not CUDA as the CPU); ``None`` where it says nothing."""
    if isinstance(test, ast.Attribute) and test.attr in {"is_cuda", "is_cpu"}:
        return ("cuda", "cpu") if test.attr == "is_cuda" else ("cpu", "cuda")
    if isinstance(test, ast.Call) and (dotted_name(test.func) or "").endswith("cuda.is_available"):
        return "cuda", "cpu"  # without CUDA every tensor is on the CPU
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        on_true, on_false = _device_test(test.operand)
        return on_false, on_true
    if isinstance(test, ast.BoolOp):
        parts = [_device_test(value) for value in test.values]
        if isinstance(test.op, ast.And):  # all hold when it holds; any may fail
            return next((t for t, _ in parts if t is not None), None), None
        return None, next((f for _, f in parts if f is not None), None)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
    ):
        sides = [test.left, test.comparators[0]]
        names = [_device_name(side) for side in sides]
        if any(_device_query(side) for side in sides) and ("cpu" in names or "cuda" in names):
            where: _Where = "cpu" if "cpu" in names else "cuda"
            other: _Where = "cuda" if where == "cpu" else "cpu"
            if isinstance(test.ops[0], (ast.Eq, ast.Is)):
                return where, other
            return other, where
    return None, None


def _device_query(node: ast.expr) -> bool:
    """``x.device.type``, ``device.type``, ``x.device``, ``str(x.device)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
        return node.func.id == "str" and _device_query(node.args[0])
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "device":
        return True
    inner = node.value
    return node.attr == "type" and (
        (isinstance(inner, ast.Attribute) and inner.attr == "device")
        or (isinstance(inner, ast.Name) and "device" in inner.id.lower())
    )


def _device_name(node: ast.expr) -> str | None:
    """``"cpu"``, ``torch.device("cuda")``: the backend a constant names."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "device"
        and len(node.args) == 1
    ):
        node = node.args[0]
    if isinstance(node, ast.Constant) and node.value in {"cpu", "cuda"}:
        return str(node.value)
    return None


def _exits(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _cpu_path(node: ast.AST, scope: Scope) -> bool:
    """``node`` runs only when a tensor is on the CPU: in the branch of a device test that
    says so (``else`` of ``if x.is_cuda:``, ``if x.device.type == "cpu":``), or after a
    branch that leaves the block when it is on CUDA (``if x.is_cuda: return ...``)."""
    parents = _parent_map(scope)
    child: ast.AST = node
    parent = parents.get(id(child))
    while parent is not None:
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test:
            on_true, on_false = _device_test(parent.test)
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            in_body = any(s is child for s in body)
            if (on_true if in_body else on_false) == "cpu":
                return True
            if isinstance(parent, ast.If) and not in_body and _builds_on_cuda(parent.body):
                return True  # `if self.gpus > 0: u = torch.zeros(k).cuda()`, `else:` the CPU
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if not isinstance(block, list) or not any(s is child for s in block):
                continue
            for stmt in block[: next(i for i, s in enumerate(block) if s is child)]:
                if not isinstance(stmt, ast.If):
                    continue
                on_true, on_false = _device_test(stmt.test)
                if _exits(stmt.body) and not _exits(stmt.orelse) and on_false == "cpu":
                    return True  # `if x.is_cuda: return ...`, then the CPU path
                if _exits(stmt.orelse) and not _exits(stmt.body) and on_true == "cpu":
                    return True
        if parent is scope.node:
            break
        child, parent = parent, parents.get(id(parent))
    return False


def _builds_on_cuda(body: list[ast.stmt]) -> bool:
    """A branch that builds its tensors with a factory and moves them with ``.cuda()``
    (lightning-bolts' SwAV loss, ``if self.gpus > 0: u = torch.zeros(k).cuda()``): its
    ``else`` builds the same on the CPU, for a run without GPUs."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "cuda"
        and any(
            isinstance(sub, ast.Call)
            and (dotted_name(sub.func) or "").rpartition(".")[2] in FACTORY_NAMES
            for sub in walk(node.func.value)
        )
        for stmt in body
        for node in walk(stmt)
    )


def _tensor_of(node: ast.AST, params: set[str], *, built: bool = True) -> str | None:
    """The parameter whose tensor (on its device) ``node`` is: ``x``, ``x[i]``, ``x.float()``,
    ``x.unsqueeze(1) * 2``, ``torch.exp(x)``; never ``x.shape[0]`` or ``x.size(1)``; without
    ``built``, never a new tensor a factory builds from it (``torch.arange(n)``)."""
    if isinstance(node, ast.Name):
        return node.id if node.id in params else None
    if isinstance(node, ast.Subscript):
        return _tensor_of(node.value, params, built=built)
    if isinstance(node, ast.Attribute):
        if (text := dotted_name(node)) in params:
            return text  # self.queue, a placed attribute
        return (
            _tensor_of(node.value, params, built=built)
            if node.attr in {"T", "mT", "data"}
            else None
        )
    if isinstance(node, ast.Call):
        func = node.func
        if (text := dotted_name(func)) is not None and f"{text}()" in params:
            return f"{text}()"  # self.get_opacities(), a method returning a parameter's ops
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in {"torch", "F"}  # `F`: torch.nn.functional, as imported
            and func.attr not in _NOT_TENSOR
        ):
            if f"torch.{func.attr}" in _BUILDERS:  # `torch.zeros(n, device=x.device)`: x's
                device = keyword(node, "device")
                if (
                    device is not None
                    and isinstance(device.value, ast.Attribute)
                    and device.value.attr == "device"
                ):
                    return _tensor_of(device.value.value, params, built=built)
                if not built:
                    return None
            for arg in node.args:
                found = _tensor_of(arg, params, built=built)
                if found is not None:
                    return found
            return None
        if isinstance(func, ast.Attribute) and func.attr not in _NOT_TENSOR | {"to", "type"}:
            return _tensor_of(func.value, params, built=built)
        return None
    if isinstance(node, ast.BinOp):
        return _tensor_of(node.left, params, built=built) or _tensor_of(
            node.right, params, built=built
        )
    if isinstance(node, ast.UnaryOp):
        return _tensor_of(node.operand, params, built=built)
    if isinstance(node, ast.Compare) and all(isinstance(op, _ORDER) for op in node.ops):
        for side in [node.left, *node.comparators]:  # x > 0.5: a mask on x's device
            found = _tensor_of(side, params, built=built)
            if found is not None:
                return found
    return None


# torch functions that build a new tensor from numbers or data (on the default device).
_BUILDERS = FACTORIES | frozenset({"torch.tensor", "torch.as_tensor", "torch.from_numpy"})
_ORDER = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _climb(node: ast.AST, parents: dict[int, ast.AST]) -> tuple[ast.AST, ast.AST | None]:
    """From a tensor expression up through what keeps it on its device (``.float()``,
    ``[None]``, ``.view(...)``, ``-t``, a branch of a conditional expression): the outermost
    such expression and its parent."""
    parent = parents.get(id(node))
    while parent is not None:
        if isinstance(parent, ast.Attribute) and parent.value is node:
            if parent.attr in _NOT_TENSOR | {"to", "type", "cuda", "type_as"}:
                return node, None
            call = parents.get(id(parent))
            if not isinstance(call, ast.Call) or call.func is not parent:
                return node, None
            node = call
        elif (
            (isinstance(parent, ast.Subscript) and parent.value is node)
            or isinstance(parent, ast.UnaryOp)
            or (isinstance(parent, ast.IfExp) and parent.test is not node)
        ):
            node = parent  # `torch.ones(n) if w is None else w`: the value may be the factory's
        else:
            return node, parent
        parent = parents.get(id(node))
    return node, None


# How many operations up a chain of arithmetic a factory's values are followed.
_CHAIN_DEPTH = 4


def _joined(
    node: ast.AST,
    parent: ast.AST | None,
    parents: dict[int, ast.AST],
    ctx: Context,
    tensors: set[str],
    *,
    depth: int = 0,
) -> str | None:
    """The parameter that the tensor expression ``node`` meets in ``parent``, also further up
    a chain of arithmetic (``loss * w.view(-1, 1) * self.task_weights``: the product with an
    operand of unknown place still holds the factory's values where it meets the next one)."""
    if isinstance(parent, ast.BinOp):
        other = parent.right if parent.left is node else parent.left
        found = _tensor_of(other, tensors)
        if found is None and depth < _CHAIN_DEPTH:
            outer, above = _climb(parent, parents)
            return _joined(outer, above, parents, ctx, tensors, depth=depth + 1)
        return found
    if isinstance(parent, ast.Compare):
        for side in [parent.left, *parent.comparators]:
            if side is not node and (found := _tensor_of(side, tensors)) is not None:
                return found
        return None
    if isinstance(parent, ast.Subscript) and parent.slice is not node:
        return None
    if isinstance(parent, (ast.Tuple, ast.List)):
        grand = parents.get(id(parent))
        if (isinstance(grand, ast.Subscript) and grand.slice is parent) or isinstance(
            grand, ast.Call
        ):
            parent = grand
        else:
            return None
    if isinstance(parent, ast.Subscript):  # x[torch.arange(n)]
        return _tensor_of(parent.value, tensors)
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr in _GATHERS
        and node in parent.args
        and ctx.qualname(parent.func) is None
    ):
        return _tensor_of(parent.func.value, tensors)  # x.index_select(0, torch.arange(n))
    if isinstance(parent, ast.Call) and ctx.call_qualname(parent) in _JOINERS:
        for arg in parent.args:
            elts = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
            for elt in elts:
                if elt is not node and (found := _tensor_of(elt, tensors)) is not None:
                    return found
        return None
    if isinstance(parent, ast.Assign) and isinstance(node, ast.Subscript):
        return None
    if isinstance(parent, ast.AugAssign) and parent.value is node:
        return _tensor_of(parent.target, tensors)
    return None


def _combined_with(call: ast.Call, ctx: Context, scope: Scope, tensors: set[str]) -> str | None:
    """The tensor parameter the factory's result meets (in an op, an index, ``torch.cat``,
    an assignment into it), right there or through the name it is bound to."""
    parents = _parent_map(scope)
    node, parent = _climb(call, parents)
    found = _joined(node, parent, parents, ctx, tensors) or _masked_by(call, node, parents, tensors)
    if found is not None:
        return found
    grids = _grids_of(node, parent, parents, ctx)
    if grids is not None:  # `h, w = torch.meshgrid(torch.arange(n), torch.arange(m))`
        end = (grids[0].end_lineno or grids[0].lineno, grids[0].end_col_offset or 0)
        for target in grids[1]:
            found = _uses_meet(target, end, ctx, scope, parents, tensors, depth=1)
            if found is not None:
                return found
        return None
    bound = _bound_through_arithmetic(node, parent, parents)
    if bound is None:
        return None
    stmt, name = bound
    after = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    return _uses_meet(name, after, ctx, scope, parents, tensors, depth=0)


def _grids_of(
    node: ast.AST, parent: ast.AST | None, parents: dict[int, ast.AST], ctx: Context
) -> tuple[ast.Assign, list[str]] | None:
    """The statement and names of ``gy, gx = torch.meshgrid(node, ...)``, the factory an
    argument of the call itself: the grids live where it does."""
    if isinstance(parent, (ast.List, ast.Tuple)):
        parent = parents.get(id(parent))
    stmt = parents.get(id(parent)) if parent is not None else None
    names = _meshgrid_names(stmt, ctx)
    if names is None or not isinstance(stmt, ast.Assign) or stmt.value is not parent:
        return None
    return stmt, names


def _meshgrid_names(stmt: ast.AST | None, ctx: Context) -> list[str] | None:
    """The names ``gy, gx = torch.meshgrid(...)`` binds to the grids; None for another
    statement."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], (ast.Tuple, ast.List))
        and isinstance(stmt.value, ast.Call)
        and (ctx.call_qualname(stmt.value) or "").endswith("meshgrid")
    ):
        return None
    return [elt.id for elt in stmt.targets[0].elts if isinstance(elt, ast.Name)]


def _bound_through_arithmetic(
    node: ast.AST, parent: ast.AST | None, parents: dict[int, ast.AST]
) -> tuple[ast.Assign, str] | None:
    """The statement and the one plain name it binds to ``node``, also to arithmetic of
    ``node`` with host numbers (``q = torch.arange(n)[:, None] * scale``: ``q`` holds the
    factory's values, where they are)."""
    for _ in range(_CHAIN_DEPTH):
        if not isinstance(parent, ast.BinOp):
            break
        node, parent = parent, parents.get(id(parent))
    name = assigned_name(parent, node)
    if name is None or not isinstance(parent, ast.Assign):
        return None
    return parent, name


def _uses_meet(
    name: str,
    after: tuple[int, int],
    ctx: Context,
    scope: Scope,
    parents: dict[int, ast.AST],
    tensors: set[str],
    *,
    depth: int,
) -> str | None:
    """The tensor parameter that a use of ``name`` after ``after`` meets (see
    ``_combined_with``), also through the grids ``torch.meshgrid`` builds from it
    (``y, x = torch.meshgrid(y, x)``: the grids live where their inputs do)."""
    uses = [
        sub
        for sub in subtree(scope.node)
        if isinstance(sub, ast.Name) and sub.id == name and (sub.lineno, sub.col_offset) > after
    ]
    for sub in sorted(uses, key=lambda use: _takes_effect(use, parents)):
        spread = _gridded(sub, name, parents, ctx)
        if spread is not None and depth < 2:
            stmt, targets = spread
            end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
            for target in targets:
                found = _uses_meet(target, end, ctx, scope, parents, tensors, depth=depth + 1)
                if found is not None:
                    return found
        if isinstance(sub.ctx, ast.Store):
            if _rebinds_itself(sub, name, parents, ctx):
                continue  # `idx = torch.clamp(idx, 0, n - 1).long()`: the same host tensor
            break  # rebound: what follows is another value
        if _element_by_counter(sub, parents):
            continue  # `x[perm[i]]` for `i in range(n)`: one 0-dim element, an int index
        outer, where = _climb(sub, parents)
        found = _joined(outer, where, parents, ctx, tensors) or _masked_by(
            sub, outer, parents, tensors
        )
        if found is not None:
            return found
        bound = _bound_through_arithmetic(outer, where, parents)
        if bound is not None and bound[1] != name and depth < 2:
            # `relative = (q - k) + offset`, then `table[relative.long()]`
            end = (bound[0].end_lineno or bound[0].lineno, bound[0].end_col_offset or 0)
            found = _uses_meet(bound[1], end, ctx, scope, parents, tensors, depth=depth + 1)
            if found is not None:
                return found
        # t[i] = x[j]: the parameter's values copied into the factory's tensor
        if (
            isinstance(where, ast.Assign)
            and isinstance(outer, ast.Subscript)
            and any(t is outer for t in where.targets)
        ):
            found = _tensor_of(where.value, tensors)
            if found is not None:
                return found
    return None


def _element_by_counter(use: ast.Name, parents: dict[int, ast.AST]) -> bool:
    """``x[perm[i]]`` with ``i`` an integer literal or the counter of an enclosing loop
    (``for i in range(n):``): one element of the host tensor as an index, which reads it as an
    int."""
    item = parents.get(id(use))
    if not (isinstance(item, ast.Subscript) and item.value is use):
        return False
    outer = parents.get(id(item))
    if not (isinstance(outer, ast.Subscript) and outer.slice is item):
        return False
    index = item.slice
    if isinstance(index, ast.Constant):
        return isinstance(index.value, int)
    node = parents.get(id(item))
    while isinstance(index, ast.Name) and node is not None:
        if isinstance(node, (ast.For, ast.AsyncFor)) and index.id in counter_names(node):
            return True
        node = parents.get(id(node))
    return False


def _rebinds_itself(use: ast.Name, name: str, parents: dict[int, ast.AST], ctx: Context) -> bool:
    """``use`` binds ``name`` to a view, cast or torch function of its own value (``idx =
    torch.clamp(idx, 0, n - 1).long()``), which stays where it was: not to a move."""
    stmt = parents.get(id(use))
    if not (isinstance(stmt, ast.Assign) and stmt.targets == [use]):
        return False
    value = stmt.value
    if _same_tensor(value, name):
        return True
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr not in {"to", "cuda", "type_as"}
        and ctx.qualname(value.func) is None
    ):
        value = value.func.value  # `.long()` of the function's result
    return (
        isinstance(value, ast.Call)
        and (ctx.call_qualname(value) or "").startswith("torch.")
        and bool(value.args)
        and _same_tensor(value.args[0], name)
    )


def _takes_effect(use: ast.Name, parents: dict[int, ast.AST]) -> tuple[int, int]:
    """Where a use of a name acts: a read where it stands, a binding at the end of its
    statement (``v = v[m]`` reads ``v`` before it rebinds it)."""
    if not isinstance(use.ctx, ast.Store):
        return use.lineno, use.col_offset
    node: ast.AST | None = use
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(id(node))
    if isinstance(node, ast.Assign):
        return node.end_lineno or node.lineno, node.end_col_offset or 0
    return use.lineno, use.col_offset


def _masked_by(
    start: ast.AST, outer: ast.AST, parents: dict[int, ast.AST], tensors: set[str]
) -> str | None:
    """The tensor that indexes the factory's tensor on the way from ``start`` up to ``outer``
    (``torch.linspace(0, 1, n)[mask]``, ``vals[x > 0.5]``): a host tensor indexed by a
    device tensor fails."""
    node = start
    while node is not outer:
        parent = parents.get(id(node))
        if parent is None:
            return None
        if isinstance(parent, ast.Subscript) and parent.value is node:
            found = _tensor_of(parent.slice, tensors)
            if found is not None:
                return found
        node = parent
    return None


def _gridded(
    use: ast.Name, name: str, parents: dict[int, ast.AST], ctx: Context
) -> tuple[ast.Assign, list[str]] | None:
    """``gy, gx = torch.meshgrid(y, x)``, also ``y, x = torch.meshgrid(y, x)`` (``use`` the
    name among the call's arguments, or on the left of such a statement): the statement and
    the names it binds to the grids, which live where ``name`` does."""
    node: ast.AST | None = use
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(id(node))
    stmt = node
    names = _meshgrid_names(stmt, ctx)
    if names is None:
        return None
    assert isinstance(stmt, ast.Assign)
    assert isinstance(stmt.value, ast.Call)
    args = [
        elt
        for arg in stmt.value.args
        for elt in (arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg])
    ]
    if not any(isinstance(arg, ast.Name) and arg.id == name for arg in args):
        return None
    return stmt, names


def _reaches_device(call: ast.Call, ctx: Context, scope: Scope) -> bool:
    """The factory's result is used as a tensor (not only its shape or size)."""
    parents = _parent_map(scope)
    node, parent = _climb(call, parents)
    if isinstance(parent, ast.Attribute):
        return False
    return not (
        isinstance(parent, ast.Call)
        and node is not parent.func
        and isinstance(parent.func, ast.Name)
        and parent.func.id in HOST_CASTS
    )
