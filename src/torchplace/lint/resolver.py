"""A small name resolver: which dotted name does an expression refer to through the imports?

``import torch as t`` makes ``t.zeros`` resolve to ``torch.zeros``; ``from torch import nn``
makes ``nn.Module`` resolve to ``torch.nn.Module``; relative imports resolve against the file's
own package, so ``from .module import Module`` inside ``torch/nn/modules/`` is found too.
Imports are file-wide (a local import counts everywhere after it): precise enough for lint,
and it keeps the resolver one dictionary.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from functools import lru_cache

from torchplace.lint.nodes import parse_module
from torchplace.lint.sources import read_neighbour

__all__ = [
    "Resolver",
    "base_names",
    "dotted_name",
    "imported_module_class",
    "is_autograd_function",
    "is_module_base",
    "module_file",
    "module_name_for",
]

# Upper-case names under torch.nn that are not nn.Module subclasses.
_NOT_MODULES = frozenset(
    {"Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer", "ParameterDict"}
)
# TorchMetrics' base of every metric: an nn.Module that registers and moves states itself.
_STATE_BASES = frozenset({"torchmetrics.Metric", "torchmetrics.metric.Metric"})
_MODULE_ROOTS = _STATE_BASES | frozenset(
    {
        "torch.nn.Module",
        "torch.jit.ScriptModule",
        "lightning.LightningModule",
        "lightning.pytorch.LightningModule",
        "pytorch_lightning.LightningModule",
        # ... also as the modules that define it export it
        "pytorch_lightning.core.LightningModule",
        "pytorch_lightning.core.lightning.LightningModule",
        "pytorch_lightning.core.module.LightningModule",
        "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule",
        # PyTorch Geometric's base of every graph layer (an nn.Module)
        "torch_geometric.nn.MessagePassing",
        "torch_geometric.nn.conv.MessagePassing",
        "torch_geometric.nn.conv.message_passing.MessagePassing",
    }
)


# Packages of pretrained models whose model classes are ``nn.Module`` subclasses.
_MODEL_PACKAGES = ("transformers.", "pytorch_transformers.", "pytorch_pretrained_bert.")


def _pretrained_model_class(qualname: str) -> bool:
    """A Hugging Face PyTorch model class: ``transformers.BertForTokenClassification``,
    ``BertPreTrainedModel``, ``GPT2LMHeadModel`` (also from the older ``pytorch_transformers``),
    not a TensorFlow or Flax twin (``TFBertModel``), an ``Auto*`` factory, a config or output."""
    if not qualname.startswith(_MODEL_PACKAGES):
        return False
    last = qualname.rpartition(".")[2]
    if not last[:1].isupper() or last.startswith(("TF", "Flax", "Auto")):
        return False
    head, sep, task = last.partition("For")
    return last.endswith("Model") or bool(sep and head and task[:1].isupper())


# diffusers classes under `diffusers.models` that are not modules: outputs, attention
# processors (callables a module holds), a VAE's posterior distribution
_DIFFUSERS_NOT_MODULES = ("Output", "Processor", "Distribution", "Config")


def _diffusers_model_class(qualname: str) -> bool:
    """A diffusers model or layer: ``diffusers.UNet2DConditionModel``, ``diffusers.ModelMixin``,
    ``diffusers.models.attention.CrossAttention`` (a class of ``diffusers.models``), not an
    output, an attention processor or a pipeline."""
    if not qualname.startswith("diffusers."):
        return False
    last = qualname.rpartition(".")[2]
    if not last[:1].isupper() or any(word in last for word in _DIFFUSERS_NOT_MODULES):
        return False
    return qualname.startswith("diffusers.models.") or last.endswith(("Model", "ModelMixin"))


# OpenMMLab's libraries, whose model code derives from `BaseModule` (an `nn.Module`).
_OPENMMLAB = ("mmcv.", "mmengine.", "mmdet.", "mmdet3d.", "mmseg.", "mmpose.", "mmaction.")
_OPENMMLAB_MODULES = (
    *("Module", "Head", "Neck", "Backbone", "Detector", "Segmentor", "Recognizer"),
    *("Classifier", "Loss", "Encoder", "Decoder", "Transformer", "Attention", "Layer"),
)


def _openmmlab_model_class(qualname: str) -> bool:
    """A model part of OpenMMLab's libraries, named for what it is in a model:
    ``mmdet3d.models.dense_heads.centerpoint_head.CenterHead``, ``mmcv.runner.BaseModule``,
    ``mmdet.models.detectors.TwoStageDetector`` (not a dataset, hook, runner or pipeline)."""
    if not qualname.startswith(_OPENMMLAB):
        return False
    last = qualname.rpartition(".")[2]
    return last[:1].isupper() and last.endswith(_OPENMMLAB_MODULES)


# The model libraries whose classes (capitalised) are modules: torchvision's models and
# layers (`torchvision.models.ResNet`, `torchvision.ops.FeaturePyramidNetwork`), timm's,
# detectron2's.
_VISION_MODELS = (
    *("torchvision.models.", "torchvision.ops.", "timm.models.", "timm.layers."),
    *("detectron2.modeling.", "detectron2.layers."),  # UniDet's `CascadeROIHeads` subclass
)
# Their classes that are no modules: weights enums, configs, detection bookkeeping.
_VISION_NOT_MODULES = (
    *("Weights", "Cfg", "Config", "ImageList", "BoxCoder", "Matcher", "Sampler"),
    *("Transform", "TransformRotated", "ShapeSpec", "Registry", "Instances", "Boxes"),
)


def _vision_model_class(qualname: str) -> bool:
    """A model or layer of torchvision, timm or detectron2: ``torchvision.models.ResNet`` (a
    ReID network subclassing it), ``timm.models.vision_transformer.VisionTransformer``,
    ``detectron2.modeling.CascadeROIHeads``; not a weights enum (``ResNet50_Weights``), a
    config or detection bookkeeping (``ImageList``, ``BoxCoder``, ``Box2BoxTransform``)."""
    if not qualname.startswith(_VISION_MODELS):
        return False
    last = qualname.rpartition(".")[2]
    return last[:1].isupper() and not last.endswith(_VISION_NOT_MODULES)


def class_bases(cls: ast.ClassDef) -> list[ast.expr]:
    """The bases of ``cls`` as classes: a generic one subscripted, ``Embeddings[Sentence]``, is
    the class ``Embeddings``."""
    return [base.value if isinstance(base, ast.Subscript) else base for base in cls.bases]


def base_names(cls: ast.ClassDef, qualname: Callable[[ast.AST], str | None]) -> list[str]:
    """The bases of ``cls``, each by the name its import resolves to (``qualname``), else as
    written (``""`` for one that is no name)."""
    return [qualname(base) or dotted_name(base) or "" for base in cls.bases]


def is_autograd_function(cls: ast.ClassDef, qualname: Callable[[ast.AST], str | None]) -> bool:
    """Whether ``cls`` derives from ``torch.autograd.Function`` (a model's own operation, whose
    ``forward`` and ``backward`` run each time a module applies it)."""
    return any(
        name.endswith(("autograd.Function", "autograd.function.Function"))
        for name in base_names(cls, qualname)
    )


def is_module_base(qualname: str) -> bool:
    """Whether a resolved base-class name is ``nn.Module`` or one of torch's module classes
    (or a pretrained model class of Hugging Face's libraries, a diffusers model or layer, or a
    model or layer of torchvision, timm or detectron2, all of which are modules)."""
    if qualname in _MODULE_ROOTS or _pretrained_model_class(qualname):
        return True
    if _diffusers_model_class(qualname) or _openmmlab_model_class(qualname):
        return True
    if _vision_model_class(qualname):
        return True
    if not qualname.startswith("torch.nn."):
        return False
    parts = qualname.split(".")
    last = parts[-1]
    # torch's private bases are modules too: `_Loss`, `_WeightedLoss`, `_ConvNd`, `_BatchNorm`
    if not last.lstrip("_")[:1].isupper() or last in _NOT_MODULES:
        return False
    # torch.nn.X, torch.nn.modules.<file>.X, torch.nn.parallel.X, torch.nn.quantized...X
    return len(parts) == 3 or parts[2] in {"modules", "parallel", "quantized", "intrinsic", "qat"}


def dotted_name(node: ast.AST) -> str | None:
    """``self.model`` -> ``"self.model"`` as written; None for anything but a name or attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


@lru_cache(maxsize=4096)
def _package_of_dir(directory: str) -> str | None:
    """The dotted package a directory is, climbing while ``__init__.py`` files exist."""
    if not os.path.isfile(os.path.join(directory, "__init__.py")):
        return None
    parent, name = os.path.split(directory)
    if not name.isidentifier():
        return None
    above = _package_of_dir(parent) if parent != directory else None
    return f"{above}.{name}" if above else name


def module_name_for(path: str) -> tuple[str | None, bool]:
    """``(dotted module name, is a package __init__)`` of a source file, or ``(None, False)``."""
    directory, filename = os.path.split(os.path.abspath(path))
    stem = filename[:-3] if filename.endswith(".py") else filename
    package = _package_of_dir(directory)
    if package is None:
        return (stem if stem.isidentifier() else None), False
    if stem == "__init__":
        return package, True
    return f"{package}.{stem}", False


class Resolver:
    """Maps local names to the dotted names they were imported as."""

    __slots__ = (
        "elsewhere_module_classes",
        "is_package",
        "local_module_classes",
        "module",
        "names",
        "stars",
    )

    def __init__(self, module: str | None = None, *, is_package: bool = False) -> None:
        self.module = module
        self.is_package = is_package
        self.names: dict[str, str] = {}
        # Modules star-imported (`from utils import *`): their names are the file's own.
        self.stars: list[str] = []
        # Classes of this file that subclass nn.Module, directly or through each other.
        self.local_module_classes: set[str] = set()
        # Those of them whose path to nn.Module goes through a class of another module.
        self.elsewhere_module_classes: set[str] = set()

    def add_import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.names[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.names[top] = top

    def add_import_from(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node.module, node.level)
        if base is None:
            return
        for alias in node.names:
            if alias.name == "*":
                if base:
                    self.stars.append(base)
                continue
            self.names[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name

    def _absolute(self, module: str | None, level: int) -> str | None:
        if level == 0:
            return module
        if self.module is None:
            return None
        parts = self.module.split(".")
        if level == 1 and len(parts) == 1 and not self.is_package:
            # a module of a folder without `__init__.py` (a namespace package): `from .boxes
            # import decode` names its sibling module, found beside it as `boxes`
            return module or ""
        drop = level - 1 if self.is_package else level
        if drop >= len(parts):
            return None
        package = parts[: len(parts) - drop]
        return ".".join(package + ([module] if module else []))

    def qualname(self, node: ast.AST) -> str | None:
        """``t.nn.Linear`` -> ``torch.nn.Linear``; None when the root is not an import."""
        written = dotted_name(node)
        if written is None:
            return None
        first, dot, rest = written.partition(".")
        root = self.names.get(first)
        if root is None and first == "torch" and dot:
            return written  # `torch` from a star import (`from utils import *`): still torch
        if root is None and first == "nn" and dot and self.stars:
            return "torch." + written  # `nn.Module` from a star import (`from .common import *`)
        return None if root is None else root + dot + rest

    def is_module_class(self, node: ast.ClassDef) -> bool:
        """Whether a class derives from ``nn.Module`` by import or through a class of this file."""
        for base in class_bases(node):
            if isinstance(base, ast.Name) and base.id in self.local_module_classes:
                if base.id not in self.elsewhere_module_classes:
                    return True
                continue
            name = self.qualname(base)
            if name is not None and is_module_base(name):
                return True
        return False

    def has_state_base(self, node: ast.ClassDef) -> bool:
        """Whether a class derives from a module base that registers and moves the states it
        is given itself (TorchMetrics' ``Metric``: ``add_state``, its own ``_apply``)."""
        return any(self.qualname(base) in _STATE_BASES for base in node.bases)

    def is_module_class_elsewhere(self, node: ast.ClassDef, path: str) -> bool:
        """Whether a class that :meth:`is_module_class` does not see derives from ``nn.Module``
        through a class another module of the linted tree defines (``from .kernel import
        Kernel``, where ``class Kernel(Module)`` and ``class Module(nn.Module)`` are in files
        of the same package), also through a class of this file that does."""
        for base in class_bases(node):
            if isinstance(base, ast.Name) and base.id in self.elsewhere_module_classes:
                return True
            name = self.qualname(base)
            if name is not None and imported_module_class(path, name):
                return True
        return False


# How many imports and base classes are followed from a class to ``nn.Module``.
_MAX_BASE_DEPTH = 8


def module_file(path: str, module: str) -> str | None:
    """The file of the linted tree that the dotted ``module`` names, looked up from ``path``'s
    folder and the folders above it (as far as the module's own depth, and two more), also
    under a ``src/`` folder there (the src layout of a package: ``src/pkg/mod.py``). In an
    installed package (under ``site-packages``), the other installed packages are not part of
    the tree."""
    return _module_file_from(os.path.dirname(os.path.abspath(path)), module)


_INSTALLED = frozenset({"site-packages", "dist-packages"})


@lru_cache(maxsize=4096)
def _module_file_from(directory: str, module: str) -> str | None:
    parts = module.split(".")
    folders = directory.split(os.sep)
    for index in range(len(folders) - 2, -1, -1):
        if folders[index] in _INSTALLED:  # linting an installed package: only its own modules
            if parts[0] != folders[index + 1]:
                return None
            break
    for _ in range(len(parts) + 2):
        for candidate in (
            os.path.join(directory, *parts) + ".py",
            os.path.join(directory, *parts, "__init__.py"),
            os.path.join(directory, "src", *parts) + ".py",
            os.path.join(directory, "src", *parts, "__init__.py"),
        ):
            if os.path.isfile(candidate):
                return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


@lru_cache(maxsize=512)
def _classes_of(path: str) -> tuple[Resolver, dict[str, ast.ClassDef]] | None:
    """The imports and the module-level classes of a file of the linted tree."""
    raw = read_neighbour(path)
    if raw is None:
        return None
    try:
        tree = parse_module(raw, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    module, is_package = module_name_for(path)
    resolver = Resolver(module, is_package=is_package)
    classes: dict[str, ast.ClassDef] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            resolver.add_import(stmt)
        elif isinstance(stmt, ast.ImportFrom):
            resolver.add_import_from(stmt)
        elif isinstance(stmt, ast.ClassDef):
            classes[stmt.name] = stmt
    return resolver, classes


@lru_cache(maxsize=4096)
def imported_module_class(path: str, qualname: str, depth: int = 0) -> bool:
    """Whether ``qualname``, a class imported by the file at ``path``, is an ``nn.Module``
    subclass defined in a module of the linted tree (through its bases, also those imported
    from further modules, and through a package ``__init__`` that re-exports the class)."""
    if depth > _MAX_BASE_DEPTH:
        return False
    module, _, name = qualname.rpartition(".")
    if not module or module.split(".")[0] in {"torch", "typing", "abc", "builtins"}:
        return False
    found = module_file(path, module)
    if found is None:
        return False
    parsed = _classes_of(found)
    if parsed is None:
        return False
    resolver, classes = parsed
    node = classes.get(name)
    if node is None:  # re-exported: ``from .kernel import Kernel`` in a package __init__
        again = resolver.names.get(name)
        return again is not None and (
            is_module_base(again) or imported_module_class(found, again, depth + 1)
        )
    for base in class_bases(node):
        if isinstance(base, ast.Name) and base.id in classes:
            if base.id != name and imported_module_class(found, f"{module}.{base.id}", depth + 1):
                return True
            continue
        base_name = resolver.qualname(base)
        if base_name is not None and (
            is_module_base(base_name) or imported_module_class(found, base_name, depth + 1)
        ):
            return True
    return False
