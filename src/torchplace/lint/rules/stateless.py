"""Modules that hold nothing ``nn.Module`` bookkeeping reaches: no parameters, no buffers, no
submodules with either, and the same computation in training and evaluation mode.

Keeping such modules in a plain list loses nothing: ``.to()`` has nothing to move,
``state_dict()`` nothing to save, ``parameters()`` nothing to hand the optimizer and ``.train()``
nothing to switch. Autoformer's ``series_decomp_multi`` keeps ``[series_decomp(k) for k in
kernel_size]``, each a moving average over an ``nn.AvgPool1d``: a list of functions in effect.
"""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Scope
from torchplace.lint.nodes import walk

__all__ = ["stateless_module"]

#: ``torch.nn`` layers without parameters or buffers whose result does not depend on the
#: training mode (not ``Dropout``, ``RReLU``, ``BatchNorm``; not ``PReLU``, which learns).
_STATELESS_LAYERS = frozenset(
    {
        *(
            f"{kind}Pool{d}d"
            for kind in ("Avg", "Max", "AdaptiveAvg", "AdaptiveMax")
            for d in "123"
        ),
        *(f"MaxUnpool{d}d" for d in "123"),
        "LPPool1d",
        "LPPool2d",
        *(
            f"{kind}Pad{d}d"
            for kind in ("Zero", "Constant", "Reflection", "Replication", "Circular")
            for d in "123"
        ),
        "ReLU",
        "ReLU6",
        "LeakyReLU",
        "ELU",
        "SELU",
        "CELU",
        "GELU",
        "SiLU",
        "Mish",
        "GLU",
        "Sigmoid",
        "LogSigmoid",
        "Tanh",
        "Tanhshrink",
        "Hardtanh",
        "Hardsigmoid",
        "Hardswish",
        "Hardshrink",
        "Softshrink",
        "Softplus",
        "Softsign",
        "Softmax",
        "Softmin",
        "LogSoftmax",
        "Threshold",
        "Identity",
        "Flatten",
        "Unflatten",
        "Upsample",
        "UpsamplingNearest2d",
        "UpsamplingBilinear2d",
        "PixelShuffle",
        "PixelUnshuffle",
        "ChannelShuffle",
    }
)

#: ``torch.nn`` losses that hold nothing.
_STATELESS_LOSSES = frozenset(
    {"L1Loss", "MSELoss", "SmoothL1Loss", "HuberLoss", "KLDivLoss", "PoissonNLLLoss"}
    | {"GaussianNLLLoss", "CosineEmbeddingLoss", "MarginRankingLoss", "HingeEmbeddingLoss"}
    | {"TripletMarginLoss", "CTCLoss", "MultiLabelMarginLoss", "SoftMarginLoss"}
)
#: ``torch.nn`` losses that register a ``weight`` (or ``pos_weight``) buffer: empty unless one
#: is given (the first positional argument, or by keyword).
_WEIGHTED_LOSSES = frozenset(
    {"BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "NLLLoss", "MultiMarginLoss"}
    | {"MultiLabelSoftMarginLoss"}
)

#: ``nn.Module`` itself, as a base class resolves.
_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})

#: Calls that give a module state of its own.
_REGISTERS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})


def stateless_module(call: ast.Call, ctx: Context, seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``call`` builds a module that holds nothing: a parameter-free ``torch.nn`` layer
    (pooling, an activation, padding, ``Identity``, a loss given no class weights), or a class
    of the file deriving from ``nn.Module`` itself whose methods store only such modules and
    plain values (never called as modules), register nothing, build no tensor on ``self`` and
    never read ``self.training``."""
    name = ctx.call_qualname(call)
    if name is not None:
        if not name.startswith("torch.nn."):
            return False
        last = name.rsplit(".", 1)[-1]
        if last in _WEIGHTED_LOSSES:  # `nn.CrossEntropyLoss()`; not `(weight=w)`, a buffer
            multi = last == "MultiMarginLoss"  # its weight comes third, after p and margin
            weighted = {kw.arg for kw in call.keywords} & {"weight", "pos_weight", None}
            return not weighted and len(call.args) <= (2 if multi else 0)
        return last in _STATELESS_LAYERS | _STATELESS_LOSSES
    func = call.func
    if not isinstance(func, ast.Name) or func.id in seen:
        return False
    cls = _file_class(ctx, func.id)
    if cls is None or not _direct_module(cls, ctx):
        return False
    return _holds_nothing(cls, ctx, seen | {func.id})


def _file_class(ctx: Context, name: str) -> ast.ClassDef | None:
    scope: Scope | None = ctx.scope
    while scope is not None and scope.kind != "module":
        scope = scope.parent
    if scope is None or not isinstance(scope.node, ast.Module):
        return None
    found = [s for s in scope.node.body if isinstance(s, ast.ClassDef) and s.name == name]
    return found[0] if len(found) == 1 else None


def _direct_module(cls: ast.ClassDef, ctx: Context) -> bool:
    """``class C(nn.Module):`` and nothing else: a base of the project, or a layer such as
    ``nn.Linear``, may hold state."""
    if len(cls.bases) != 1 or cls.keywords:
        return False
    return ctx.qualname(cls.bases[0]) in _MODULE


def _holds_nothing(cls: ast.ClassDef, ctx: Context, seen: frozenset[str]) -> bool:
    called = _called_attributes(cls)
    for node in walk(cls):
        if isinstance(node, ast.Attribute) and _on_self(node) and node.attr == "training":
            return False  # behaves differently in eval mode, which a plain list never passes on
        if isinstance(node, ast.Call) and _gives_state(node):
            return False
        for target in _self_targets(node):
            value = getattr(node, "value", None)
            if isinstance(value, ast.Call):
                if not stateless_module(value, ctx, seen):
                    return False
            elif value is not None and (
                any(isinstance(sub, (ast.Call, ast.Lambda)) for sub in walk(value))
                or (isinstance(target, ast.Attribute) and target.attr in called)
            ):
                return False  # built from calls, or a stored value used as a module
    return True


def _gives_state(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr in _REGISTERS or func.attr == "Parameter"
    return isinstance(func, ast.Name) and func.id in {"Parameter", "setattr"}


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def _self_targets(node: ast.AST) -> list[ast.expr]:
    """The targets rooted at ``self`` that a statement stores into: ``self.x``, ``self.x[k]``,
    ``self.x.y``, also inside a tuple target."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    found: list[ast.expr] = []
    for target in targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        for element in elements:
            root = element
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Starred)):
                inner = root.value
                if isinstance(inner, ast.Name) and inner.id == "self":
                    found.append(root)
                    break
                root = inner
    return found


def _called_attributes(cls: ast.ClassDef) -> set[str]:
    """Attributes the class calls, ``self.block(x)``: what they hold runs as a module."""
    return {
        node.func.attr
        for node in walk(cls)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _on_self(node.func)
    }
