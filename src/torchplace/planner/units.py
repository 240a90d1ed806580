"""The placeable pieces of a model (units), their weights, and the tied-weight groups.

A *unit* is a module that a strategy puts on one device whole: the model's children, with
containers (``ModuleList``, ``Sequential``, ``ModuleDict``; a ``ParameterList`` or
``ParameterDict`` into its tensors) opened up and any module bigger
than ``limit`` bytes split into its children, which is how accelerate cuts a model when
``no_split_module_classes`` names the repeated blocks. An opened module's own parameters and
buffers (a ViT's top-level ``cls_token``, a model's top-level buffers) are units of their own,
as accelerate's device maps have them. Sizes are counted as accelerate's
``compute_module_sizes`` counts them (a ``bool`` tensor at its real byte an element, not the
bit accelerate takes), tied groups come from its ``find_tied_parameters``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "Unit",
    "Units",
    "accelerate",
    "is_tensor_unit",
    "module_sizes",
    "select_units",
    "submodule",
    "tensor_slot",
    "unit_tensors",
]

_INSTALL = "pip install 'torchplace[plan]'"


def accelerate() -> Any:
    """``accelerate.utils``, or a ConfigError that says how to install it."""
    try:
        import accelerate.utils
    except ImportError as exc:
        raise ConfigError(
            f"torchplace plan needs accelerate for its sizing and tie helpers ({exc}); "
            f"install it with: {_INSTALL}"
        ) from None
    return accelerate.utils


@dataclass(frozen=True)
class Unit:
    """One placeable module: path, class, and its parameters and buffers (names -> bytes)."""

    path: str
    kind: str
    params: dict[str, int]  # full parameter name -> bytes, each tensor once in the unit
    buffers: dict[str, int]
    dtype: str

    @property
    def weight_bytes(self) -> int:
        return sum(self.params.values())

    @property
    def buffer_bytes(self) -> int:
        return sum(self.buffers.values())

    def holds(self, name: str) -> bool:
        """Whether parameter or buffer ``name`` is this unit's (under any of its names)."""
        return _held(name, self.path)


@dataclass(frozen=True)
class Units:
    """A model cut into units, with its tied groups (lists of parameter names) and its shared
    buffers (one buffer registered in several units: a causal mask or rotary table per block)."""

    units: tuple[Unit, ...]
    tied: tuple[tuple[str, ...], ...]
    sizes: dict[str, int]  # module_sizes: compute_module_sizes' (tied weights counted once)
    shared: tuple[tuple[str, ...], ...] = ()  # buffer names, grouped by the tensor they name

    @property
    def paths(self) -> list[str]:
        return [u.path for u in self.units]

    def unit_of(self, name: str) -> str:
        """The unit holding parameter or module ``name``."""
        for unit in self.units:
            if _held(name, unit.path):
                return unit.path
        raise ConfigError(f"{name!r} belongs to no unit of the plan")

    def ordered(self, order: Sequence[str]) -> Units:
        """The same units in run order (``order``: unit paths as first called)."""
        rank = {path: i for i, path in enumerate(order)}
        units = sorted(self.units, key=lambda u: rank.get(u.path, len(rank)))
        return Units(tuple(units), self.tied, self.sizes, self.shared)


def _is_container(module: nn.Module) -> bool:
    from torch import nn

    return isinstance(module, nn.ModuleList | nn.Sequential | nn.ModuleDict)


def _parametrized(module: nn.Module, path: str) -> bool:
    """Whether ``module`` (not the model) computes a weight from its parametrizations
    (``parametrizations.orthogonal``, ``weight_norm``): its own code reads what they make and its
    other tensors in one operator, so it stays whole, however big."""
    from torch.nn.utils import parametrize

    return bool(path) and parametrize.is_parametrized(module)


def _holds_tensors(module: nn.Module) -> bool:
    from torch import nn

    return isinstance(module, nn.ParameterList | nn.ParameterDict)


def unit_tensors(model: nn.Module, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A unit's parameters and buffers by full name, each tensor once (under the first name
    the unit holds it by: a head tied to an embedding in the same unit is one weight): a
    module's, recursively, or the one parameter or buffer a tensor unit is."""
    slot = tensor_slot(model, path)
    if slot is not None:
        parent, leaf = slot
        if leaf in parent._parameters:
            return {path: parent._parameters[leaf]}, {}
        return {}, {path: parent._buffers[leaf]}
    prefix = f"{path}." if path else ""
    module = submodule(model, path)
    params = {prefix + n: t for n, t in module.named_parameters()}
    buffers = {prefix + n: t for n, t in module.named_buffers()}
    return params, buffers


def submodule(model: nn.Module, path: str) -> nn.Module:
    """``submodule(model, path)``, for TorchScript modules too (which refuse it); an
    AttributeError names the first missing part."""
    module = model
    for part in path.split(".") if path else ():
        children = module._modules  # a TorchScript module's too (by lookup, not a copy)
        child = children[part] if part in children else None  # noqa: SIM401 (no .get there)
        if child is None:
            raise AttributeError(f"{type(module).__name__} has no submodule {part!r}")
        module = child
    return module


def tensor_slot(model: nn.Module, path: str) -> tuple[nn.Module, str] | None:
    """The module and attribute name of the parameter or buffer ``path`` names (a module's own
    tensor placed alone, as accelerate places a model's top-level ``cls_token``); None when
    ``path`` names a module."""
    owner, _, leaf = path.rpartition(".")
    try:
        parent = submodule(model, owner)
    except AttributeError:
        return None
    return (parent, leaf) if leaf in parent._parameters or leaf in parent._buffers else None


def is_tensor_unit(model: nn.Module, path: str) -> bool:
    """Whether ``path`` names a parameter or buffer rather than a module."""
    return tensor_slot(model, path) is not None


def _nbytes(tensors: dict[str, Any]) -> dict[str, int]:
    return {n: t.numel() * t.element_size() for n, t in tensors.items() if t is not None}


def _own_bytes(module: nn.Module) -> int:
    """The bytes a module holds as a unit would: each of its tensors once, a weight tied to
    one outside it included (``compute_module_sizes`` counts a tied weight under its first
    name alone: BART's encoder without its embedding, tied to ``shared``)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def module_sizes(model: nn.Module) -> dict[str, int]:
    """Each module's bytes, keyed and ordered as accelerate's ``compute_module_sizes`` has them
    (parameters, then buffers, each tensor once, under its first name: a tied weight counted
    under the first module holding it), a tensor's bytes as a device holds them: a ``bool``
    mask 1 byte an element, where accelerate counts it 1 bit (GPT-Neo's 64 KiB causal mask
    per block as 8 KiB, so that ``fill`` put two blocks past ``--max-memory``)."""
    sizes: dict[str, int] = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        size = t.numel() * t.element_size()
        parts = name.split(".")
        for i in range(len(parts) + 1):
            key = ".".join(parts[:i])
            sizes[key] = sizes.get(key, 0) + size
    return sizes


def _default_paths(model: nn.Module, limit: int | None, whole: Collection[str] = ()) -> list[str]:
    """The model's children, containers opened and modules over ``limit`` split (those named
    in ``whole`` excepted), a module's size counted as its unit's is (a weight tied to one
    outside it included); an opened module's own parameters and buffers become units of
    their own. A module registered under several paths (``self.shared`` and
    ``self.layers[0]``) is one unit, under its first path."""
    chosen: list[str] = []
    seen: set[int] = set()

    def visit(path: str, module: nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        children = list(module.named_children())
        direct = any(True for _ in module.parameters(recurse=False))
        too_big = limit is not None and path not in whole and _own_bytes(module) > limit
        # a ParameterList or ParameterDict holds tensors read one by one, each beside the
        # layer it goes with (per-layer scales): each one a unit, as a ModuleList's layers
        tensors = _holds_tensors(module)
        opened = path == "" or too_big or tensors or (_is_container(module) and not direct)
        if not (opened and (children or tensors)) or _parametrized(module, path):
            chosen.append(path)
            return
        prefix = f"{path}." if path else ""
        own = [*module._parameters.items(), *module._buffers.items()]
        chosen.extend(prefix + name for name, t in own if t is not None)
        for name, child in children:
            visit(prefix + name, child)

    visit("", model)
    return chosen


def _checked_paths(model: nn.Module, paths: Sequence[str]) -> None:
    """Given paths (a device map's keys) must name modules or tensors, without overlapping,
    and hold every parameter and buffer of the model between them."""
    for path in paths:
        if path and not is_tensor_unit(model, path):
            try:
                submodule(model, path)
            except AttributeError:
                raise ConfigError(
                    f"the device map names {path!r}, which is neither a module nor a parameter "
                    f"of {type(model).__name__}; use module paths as model.named_modules() "
                    "gives them"
                ) from None
    for path in paths:
        inner = [q for q in paths if q != path and (path == "" or q.startswith(path + "."))]
        if inner:
            raise ConfigError(
                f"the device map places {path!r} and also {inner[0]!r} inside it; give each "
                "module once (the parent, or its pieces)"
            )
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    missing = [n for n in names if not any(_held(n, p) for p in paths)]
    if missing:
        raise ConfigError(
            f"the device map places no device for {', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''} ({len(missing)} tensor(s)); add their "
            "module (or a parent) to the map"
        )


def _held(name: str, path: str) -> bool:
    return path == "" or name == path or name.startswith(path + ".")


def _tied_groups(model: nn.Module, paths: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """accelerate's tied groups, each name as some unit holds it: an alias of a module
    registered twice (``self.dec = self.enc``) is no unit's, so it becomes the name the unit
    holds; a group left with one name is no tie between units."""
    canonical = {id(t): n for n, t in model.named_parameters()}
    every = dict(model.named_parameters(remove_duplicate=False))
    out = []
    for group in accelerate().find_tied_parameters(model):
        names = [
            n if any(_held(n, p) for p in paths) else canonical[id(every[n])]
            for n in group
            if n in every
        ]
        unique = tuple(dict.fromkeys(names))
        if len(unique) > 1:
            out.append(unique)
    return tuple(out)


def _shared_buffers(model: nn.Module, paths: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Buffers registered under several names that different units hold, grouped by tensor
    (accelerate's tied groups are parameters only): each device holding one counts it once."""
    groups: dict[int, list[str]] = {}
    for name, t in model.named_buffers(remove_duplicate=False):
        groups.setdefault(id(t), []).append(name)
    out = []
    for names in (g for g in groups.values() if len(g) > 1):
        holders = {next((p for p in paths if _held(n, p)), None) for n in names}
        if len(holders - {None}) > 1:
            out.append(tuple(names))
    return tuple(out)


def select_units(
    model: nn.Module,
    *,
    limit: int | None = None,
    paths: Sequence[str] | None = None,
    whole: Collection[str] = (),
) -> Units:
    """Cut ``model`` into units (or take the given ``paths``, e.g. from a device map); the
    modules named in ``whole`` are not split, however big."""
    sizes = module_sizes(model)
    if paths is None:
        paths = _default_paths(model, limit, whole)
    else:
        _checked_paths(model, paths)
    units = []
    for path in paths:
        params, buffers = unit_tensors(model, path)
        kind = (
            ("Parameter" if params else "Buffer")
            if is_tensor_unit(model, path)
            else type(submodule(model, path)).__name__
        )
        # a unit's parameters give its dtype; a unit of buffers alone (a table, a mask) theirs
        tensors = params or buffers
        dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
        units.append(
            Unit(path, kind, _nbytes(params), _nbytes(buffers), ",".join(sorted(dtypes)) or "-")
        )
    return Units(tuple(units), _tied_groups(model, paths), sizes, _shared_buffers(model, paths))
