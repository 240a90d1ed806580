"""A module's ``forward`` that no caller in sight runs: it runs on every batch the module is
given all the same, wherever that happens (a script of another package, a framework's loop, a
layer five submodules down or built through a registry).

In a project whose code runs models (:func:`~torchplace.lint.project.runs_models`), its tensor
inputs and its buffers are taken to live on the device: a module's operands live where its
weights do, and a loss takes the model's outputs. Elsewhere only what it places itself is
known; in a library of models that nothing of its project runs, it is not taken for per batch.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchplace.lint.nodes import walk
from torchplace.lint.project import runs_models
from torchplace.lint.provenance.flow import MOVED_SELF
from torchplace.lint.provenance.loops import calls_backward
from torchplace.lint.provenance.values import Fact

if TYPE_CHECKING:
    from torchplace.lint.provenance.files import FileFacts

__all__ = ["module_forward"]

# Annotations of Python values: `int`, `Optional[float]`, `list[str]`, `bool`.
_PLAIN = re.compile(r"\b(?:int|float|bool|str)\b")
# What only a tensor has among the attributes and methods a name is used with.
_TENSOR_USES = frozenset(
    {"to", "cuda", "cpu", "float", "half", "long", "int", "bool", "contiguous", "view"}
    | {"reshape", "clone", "detach", "unsqueeze", "squeeze", "permute", "transpose", "flatten"}
    | {"repeat", "expand", "any", "all", "isnan", "isinf", "isfinite", "eq", "ne", "gt", "lt"}
    | {"ge", "le", "min", "max", "sum", "mean", "norm", "abs", "amax", "amin", "std"}
    | {"shape", "device", "dtype", "size", "dim", "numel"}
)


def module_forward(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> tuple[str, dict[str, Fact], bool] | None:
    """``(how, seeds, runs)`` for the ``forward`` of a module class of the file: why it runs per
    batch, what its parameters and ``self`` hold (nothing known unless the project runs
    models), and whether it does; None for another function, a ``forward`` that trains (runs
    backward passes itself), or a library of models alone."""
    cls = facts.parent.get(id(function))
    if function.name != "forward" or not isinstance(cls, ast.ClassDef):
        return None
    if not (
        facts.resolver.is_module_class(cls)
        or facts.resolver.is_module_class_elsewhere(cls, facts.path)
    ):
        return None
    if calls_backward(function):
        return None  # a `forward` that trains (BYOL's trainer runs its steps in one)
    runs = runs_models(facts.path)
    if runs is False:
        return None  # a library of models that no code of its project runs
    how = f"`{cls.name}.forward` runs on every batch the module is given"
    return how, _inputs(facts, function) if runs else {}, bool(runs)


def _inputs(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Fact]:
    """The tensor inputs of ``forward`` as device values (annotated ``Tensor``, or used as
    one), and its buffers. Not ``self``, ``*args``/``**kwargs``, a parameter annotated as a
    Python value or defaulting to a number, string or flag (``drop_text=False``)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults: dict[str, ast.expr | None] = dict(
        zip([a.arg for a in positional][::-1], args.defaults[::-1], strict=False)
    )
    defaults.update(zip([a.arg for a in args.kwonlyargs], args.kw_defaults, strict=True))
    used = _used_as_tensors(facts, function)
    seeds = {}
    for arg in [*positional[1:], *args.kwonlyargs]:
        default = defaults.get(arg.arg)
        if isinstance(default, ast.Constant) and default.value is not None:
            continue
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        if "Tensor" not in annotation and (arg.arg not in used or _PLAIN.search(annotation)):
            continue
        seeds[arg.arg] = Fact("device", arg.arg, f"`{arg.arg}`, an input of the module's forward")
    seeds[MOVED_SELF] = Fact("device", "self", "a buffer of the module, where its inputs are")
    return seeds


def _used_as_tensors(facts: FileFacts, function: ast.AST) -> set[str]:
    """The names ``function`` uses as tensors: with a tensor's attribute or method
    (``x.shape``, ``x.view(...)``, ``w.sum()``), indexed as only arrays are (``m[:, 0]``), or
    given to a torch function (``torch.sum(keep)``); a list of layer indices or a start count
    (``startp``) is none."""
    used: set[str] = set()
    for node in walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in _TENSOR_USES:
                used.add(node.value.id)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and isinstance(node.slice, ast.Tuple)
            and any(
                isinstance(i, ast.Slice) or (isinstance(i, ast.Constant) and i.value is None)
                for i in node.slice.elts
            )
        ):
            used.add(node.value.id)  # `shapes[:, 0]`, `valid[:, None]`: not a list's indexing
        elif isinstance(node, ast.Call) and (facts.qualname(node.func) or "").startswith("torch."):
            used |= {a.id for a in node.args if isinstance(a, ast.Name)}
    return used
