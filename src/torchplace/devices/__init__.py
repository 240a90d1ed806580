"""Device specs, resolution and inventory.

:func:`resolve_device` turns a loose spec (``"auto"``, ``"cuda"``, ``1``, ``"cuda:1"``,
``torch.device(...)``) into one explicit :class:`torch.device` with an index, or raises an error
that says what is visible and how to fix it. :func:`device_inventory` lists every visible
accelerator with the physical id it maps to under ``CUDA_VISIBLE_DEVICES``.

Every hardware query goes through a :class:`DeviceProbe`. The default, :class:`TorchProbe`, asks
torch (and NVML for the driver) only when a function is called, never at import. Tests and
CPU-only CI pass a :class:`FakeProbe` instead, which describes any machine: a CPU-only build,
eight GPUs with ``CUDA_VISIBLE_DEVICES="2,0"``, an MPS laptop.

Modules:

* ``spec``: parsing a spec into (type, index);
* ``resolve``: :func:`resolve_device`, ``$TORCHPLACE_DEVICE``, :func:`cuda_unavailable_reason`;
* ``inventory``: :func:`device_inventory` (and :func:`inventory_by_device`, which sets apart a
  device that cannot be read) and :class:`DeviceInfo`;
* ``visible``: ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``, parsed as the runtime does, and
  on ROCm applied after ``ROCR_VISIBLE_DEVICES``;
* ``probe``: :class:`DeviceProbe`, the real :class:`TorchProbe` and :func:`default_probe`;
* ``fake``: :class:`FakeProbe`, an imaginary machine for tests.
"""

from __future__ import annotations

from torchplace.devices.fake import FakeProbe
from torchplace.devices.inventory import DeviceInfo, device_inventory, inventory_by_device
from torchplace.devices.probe import (
    DeviceProbe,
    DeviceProperties,
    DriverInfo,
    TorchProbe,
    default_probe,
)
from torchplace.devices.resolve import DEVICE_ENV_VAR, cuda_unavailable_reason, resolve_device
from torchplace.devices.visible import VisibleDevices, parse_visible_devices, visible_devices

__all__ = [
    "DEVICE_ENV_VAR",
    "DeviceInfo",
    "DeviceProbe",
    "DeviceProperties",
    "DriverInfo",
    "FakeProbe",
    "TorchProbe",
    "VisibleDevices",
    "cuda_unavailable_reason",
    "default_probe",
    "device_inventory",
    "inventory_by_device",
    "parse_visible_devices",
    "resolve_device",
    "visible_devices",
]
