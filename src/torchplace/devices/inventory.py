"""The inventory: every accelerator this process can see (:func:`device_inventory`, or
:func:`inventory_by_device` to set apart a device that cannot be read), with the physical id each
maps to under ``CUDA_VISIBLE_DEVICES`` (:class:`DeviceInfo`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torchplace.devices.probe import DeviceProbe, checked_probe, cuda_built
from torchplace.devices.spec import OTHER_ACCELERATORS
from torchplace.devices.visible import VisibleDevices, visible_devices

__all__ = ["DeviceInfo", "device_inventory", "inventory_by_device"]


@dataclass(frozen=True)
class DeviceInfo:
    """One visible accelerator: its logical index and the physical device behind it."""

    device: str
    index: int
    physical_id: str
    name: str
    capability: tuple[int, int] | None
    total_memory: int | None
    free_memory: int | None
    multi_processor_count: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    l2_cache_size: int | None = None
    is_integrated: bool | None = None
    arch: str | None = None

    @property
    def sm(self) -> str | None:
        """``"sm_90"`` for capability (9, 0); None if unknown."""
        return None if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (capability as ``"9.0"``)."""
        data = dataclasses.asdict(self)
        data["capability"] = (
            None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"
        )
        data["sm"] = self.sm
        return data


def device_inventory(*, probe: DeviceProbe | None = None) -> list[DeviceInfo]:
    """Every accelerator this process can see, in logical order.

    CUDA (and ROCm) devices come with the physical id each maps to under
    ``CUDA_VISIBLE_DEVICES``, name, compute capability and memory. An MPS or XPU device is listed
    with what its backend reports. A CPU-only machine gives ``[]``. A device whose properties
    cannot be read raises the runtime's error; :func:`inventory_by_device` sets it apart instead.

    Free memory comes from ``torch.cuda.mem_get_info``, which creates the CUDA context of every
    device it asks about (a few hundred MiB of device memory each, for the life of the
    process): call this from a diagnostic tool, not from every rank of a multi-GPU job.
    """
    found, failed = inventory_by_device(probe=probe)
    if failed:
        raise next(iter(failed.values()))
    return found


def inventory_by_device(
    *, probe: DeviceProbe | None = None
) -> tuple[list[DeviceInfo], dict[str, Exception]]:
    """:func:`device_inventory`, with each device that cannot be read set apart.

    Returns the devices that could be read, and the error of each one that could not, by its
    name (``{"cuda:1": RuntimeError(...)}``): one GPU that fell off the bus does not hide the
    others. A runtime that cannot even count its devices still raises.
    """
    probe = checked_probe(probe)
    if cuda_built(probe) and probe.cuda_available():
        vis = visible_devices(probe=probe)
        found: list[DeviceInfo] = []
        failed: dict[str, Exception] = {}
        for i in range(probe.device_count()):
            try:
                found.append(_cuda_device(probe, vis, i))
            except Exception as exc:  # reported with the device it concerns
                failed[f"cuda:{i}"] = exc
        return found, failed
    return [
        DeviceInfo(
            device=f"{kind}:{i}",
            index=i,
            physical_id=str(i),
            name=kind.upper(),
            capability=None,
            total_memory=None,
            free_memory=None,
        )
        for kind in OTHER_ACCELERATORS
        if probe.backend_available(kind)
        for i in range(probe.backend_device_count(kind))
    ], {}


def _cuda_device(probe: DeviceProbe, vis: VisibleDevices, i: int) -> DeviceInfo:
    props = probe.properties(i)
    try:
        free: int | None = probe.mem_get_info(i)[0]
    except Exception:  # optional: e.g. a device in exclusive mode, or full
        free = None
    return DeviceInfo(
        device=f"cuda:{i}",
        index=i,
        physical_id=vis.physical_id(i),
        name=props.name,
        capability=(props.major, props.minor),
        total_memory=props.total_memory,
        free_memory=free,
        multi_processor_count=props.multi_processor_count,
        uuid=props.uuid,
        pci_bus_id=props.pci_bus_id,
        l2_cache_size=props.l2_cache_size,
        is_integrated=props.is_integrated,
        arch=props.gcn_arch_name,
    )
