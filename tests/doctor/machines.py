"""Fake machines for the doctor's tests: GPUs, drivers and builds described by a FakeProbe."""

from __future__ import annotations

from typing import Any

import torch

from torchplace.devices import DeviceProperties, DriverInfo, FakeProbe
from torchplace.doctor import collect

GiB = 2**30
H200 = DeviceProperties("NVIDIA H200", 9, 0, 141 * GiB, 132, "GPU-aaaa1111")
K80 = DeviceProperties("Tesla K80", 3, 7, 12 * GiB, 13, "GPU-cccc3333")
CU128_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
NVML_OK = DriverInfo(True, "570.86", "12.8", 3, ("0: NVIDIA H200 (GPU-aaaa1111)",))
CPU_BUILD = torch.version.cuda is None and torch.version.hip is None


def machine(
    *devices: DeviceProperties,
    env: dict[str, str] | None = None,
    driver: DriverInfo = NVML_OK,
    **kw: Any,
) -> FakeProbe:
    return FakeProbe(
        devices=list(devices),
        cuda_version="12.8",
        version="2.13.0+cu128",
        cudnn=91002,
        arches=CU128_ARCHES,
        env_vars=env or {},
        driver_info=driver,
        **kw,
    )


def report_for(spec: str, probe: FakeProbe, **kw: Any) -> dict[str, Any]:
    return collect(spec, probe=probe, smoke=False, toolkit=lambda: "12.8.93", **kw)


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    hits = [c for c in report["checks"] if c["name"] == name]
    assert len(hits) == 1, [c["name"] for c in report["checks"]]
    return hits[0]
