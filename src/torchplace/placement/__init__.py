"""Where tensors, modules and batches live: same-device checks, module audits, nested moves.

- :func:`check_same_device` takes named tensors, modules and nested containers and returns their
  one common device, or raises :class:`~torchplace.errors.MixedDeviceError` with a table that
  marks the odd ones out.
- :func:`audit_module` groups a module's parameters and buffers (and quantized modules' packed
  weights) by device and dtype and finds the *stray* tensors that ``module.to()`` will not move
  (plain tensor attributes, tensors inside plain lists, tuples, dicts and sets, modules kept in
  plain containers), each named by its path.
- :func:`move` returns a new structure with every tensor on the device, using ``non_blocking``
  only where it is safe.

Nothing here touches a device at import time.

Modules:

* ``canonical``: :func:`canonical_device`, what "the same device" means;
* ``same_device``: :func:`check_same_device` and its mismatch table;
* ``audit``: :func:`audit_module`, :class:`ModuleAudit` and its records and groups;
* ``packed``: which quantized modules keep weights packed (CPU-only), and reading them back;
* ``nested``: :func:`move` and :func:`map_tensors`, the walk that rebuilds nested structures;
* ``containers``: which values are leaves or containers, how paths into them are written, and
  the text helpers the messages share.
"""

from __future__ import annotations

from torchplace.placement.audit import ModuleAudit, TensorGroup, TensorRecord, audit_module
from torchplace.placement.canonical import canonical_device
from torchplace.placement.nested import map_tensors, move
from torchplace.placement.same_device import check_same_device

__all__ = [
    "ModuleAudit",
    "TensorGroup",
    "TensorRecord",
    "audit_module",
    "canonical_device",
    "check_same_device",
    "map_tensors",
    "move",
]
