"""torchplace: make the PyTorch device contract explicit, checked, measured and observable.

The public surface is exactly ``__all__``. Names are imported on first use, so ``import
torchplace`` is cheap and does not import torch until a name that needs it is touched.

Each area is a subpackage (``devices``, ``placement``, ``doctor``, ``sanitizer`` for guard,
``lint``, ``bench``, ``prefetch``, ``planner`` for plan, ``serve``), whose docstring maps its
modules. The modules at the top are shared by all of them:

==============  ====================================================================================
``cli``         ``torchplace COMMAND``: the one entry point, each command's parser from its area
``report``      the one output convention: ``--format``/``--json``/``-o``, exit codes, the envelope
``errors``      the one exception tree, rooted at :class:`TorchplaceError`
``checkpoint``  :func:`load_checkpoint`: a state dict onto any device, safely
``models``      the embedded demo models (``seed-mlp``, ``wide-mlp``), built in code
==============  ====================================================================================
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # core: devices
    "DeviceInfo": "torchplace.devices",
    "device_inventory": "torchplace.devices",
    "resolve_device": "torchplace.devices",
    # core: placement
    "ModuleAudit": "torchplace.placement",
    "audit_module": "torchplace.placement",
    "check_same_device": "torchplace.placement",
    "move": "torchplace.placement",
    # core: checkpoints
    "load_checkpoint": "torchplace.checkpoint",
    # guard
    "GuardReport": "torchplace.sanitizer",
    "guard": "torchplace.sanitizer",
    # bench
    "Measurement": "torchplace.bench.timer",
    "Timer": "torchplace.bench.timer",
    "measure": "torchplace.bench.timer",
    # prefetch
    "DevicePrefetcher": "torchplace.prefetch",
    # plan
    "Plan": "torchplace.planner.api",
    "plan": "torchplace.planner.api",
    # errors
    "CheckpointError": "torchplace.errors",
    "ConfigError": "torchplace.errors",
    "DeviceError": "torchplace.errors",
    "DeviceIndexError": "torchplace.errors",
    "DeviceUnavailableError": "torchplace.errors",
    "GuardViolation": "torchplace.errors",
    "MixedDeviceError": "torchplace.errors",
    "PlacementError": "torchplace.errors",
    "StateDictMismatchError": "torchplace.errors",
    "TimingError": "torchplace.errors",
    "TorchplaceError": "torchplace.errors",
    "UnsafeCheckpointError": "torchplace.errors",
}

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DeviceError",
    "DeviceIndexError",
    "DeviceInfo",
    "DevicePrefetcher",
    "DeviceUnavailableError",
    "GuardReport",
    "GuardViolation",
    "Measurement",
    "MixedDeviceError",
    "ModuleAudit",
    "PlacementError",
    "Plan",
    "StateDictMismatchError",
    "Timer",
    "TimingError",
    "TorchplaceError",
    "UnsafeCheckpointError",
    "__version__",
    "audit_module",
    "check_same_device",
    "device_inventory",
    "guard",
    "load_checkpoint",
    "measure",
    "move",
    "plan",
    "resolve_device",
]

if _typing.TYPE_CHECKING:
    from torchplace.bench.timer import Measurement, Timer, measure
    from torchplace.checkpoint import load_checkpoint
    from torchplace.devices import DeviceInfo, device_inventory, resolve_device
    from torchplace.errors import (
        CheckpointError,
        ConfigError,
        DeviceError,
        DeviceIndexError,
        DeviceUnavailableError,
        GuardViolation,
        MixedDeviceError,
        PlacementError,
        StateDictMismatchError,
        TimingError,
        TorchplaceError,
        UnsafeCheckpointError,
    )
    from torchplace.placement import ModuleAudit, audit_module, check_same_device, move
    from torchplace.planner.api import Plan, plan
    from torchplace.prefetch import DevicePrefetcher
    from torchplace.sanitizer import GuardReport, guard


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchplace' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
