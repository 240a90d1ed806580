"""The placeable pieces of a model (units), their weights, and the tied-weight groups.

A *unit* is a module that a strategy puts on one device whole: the model's children, with
containers (``ModuleList``, ``Sequential``, ``ModuleDict``) opened up and any module bigger
than ``limit`` bytes split into its children, which is how accelerate cuts a model when
``no_split_module_classes`` names the repeated blocks. Sizes and tied groups come from
accelerate's ``compute_module_sizes`` and ``find_tied_parameters``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Unit", "Units", "accelerate", "select_units"]

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
    params: dict[str, int]  # full parameter name -> bytes (tied names included)
    buffers: dict[str, int]
    dtype: str

    @property
    def weight_bytes(self) -> int:
        return sum(self.params.values())

    @property
    def buffer_bytes(self) -> int:
        return sum(self.buffers.values())


@dataclass(frozen=True)
class Units:
    """A model cut into units, with its tied groups (lists of parameter names)."""

    units: tuple[Unit, ...]
    tied: tuple[tuple[str, ...], ...]
    sizes: dict[str, int]  # accelerate's compute_module_sizes (tied weights counted once)

    @property
    def paths(self) -> list[str]:
        return [u.path for u in self.units]

    def unit_of(self, name: str) -> str:
        """The unit holding parameter or module ``name``."""
        for unit in self.units:
            if unit.path == "" or name == unit.path or name.startswith(unit.path + "."):
                return unit.path
        raise ConfigError(f"{name!r} belongs to no unit of the plan")

    def ordered(self, order: Sequence[str]) -> Units:
        """The same units in run order (``order``: unit paths as first called)."""
        rank = {path: i for i, path in enumerate(order)}
        units = sorted(self.units, key=lambda u: rank.get(u.path, len(rank)))
        return Units(tuple(units), self.tied, self.sizes)


def _is_container(module: nn.Module) -> bool:
    from torch import nn

    return isinstance(module, nn.ModuleList | nn.Sequential | nn.ModuleDict)


def select_units(
    model: nn.Module, *, limit: int | None = None, paths: Sequence[str] | None = None
) -> Units:
    """Cut ``model`` into units (or take the given ``paths``, e.g. from a device map)."""
    helpers = accelerate()
    sizes: dict[str, int] = dict(helpers.compute_module_sizes(model))
    if paths is None:
        chosen: list[str] = []

        def visit(path: str, module: nn.Module) -> None:
            children = list(module.named_children())
            direct = any(True for _ in module.parameters(recurse=False))
            too_big = limit is not None and sizes.get(path, 0) > limit
            if children and not direct and (path == "" or _is_container(module) or too_big):
                for name, child in children:
                    visit(f"{path}.{name}" if path else name, child)
            else:
                chosen.append(path)

        visit("", model)
        paths = chosen
    units = []
    for path in paths:
        module = model.get_submodule(path)
        prefix = f"{path}." if path else ""
        params = {
            prefix + n: p.numel() * p.element_size()
            for n, p in module.named_parameters(remove_duplicate=False)
        }
        buffers = {prefix + n: b.numel() * b.element_size() for n, b in module.named_buffers()}
        dtypes = {str(p.dtype).removeprefix("torch.") for p in module.parameters()}
        units.append(
            Unit(path, type(module).__name__, params, buffers, ",".join(sorted(dtypes)) or "-")
        )
    tied = tuple(tuple(group) for group in helpers.find_tied_parameters(model))
    return Units(tuple(units), tied, sizes)
