"""Imaginary machines for the device tests: GPUs' properties and probes of whole machines."""

from __future__ import annotations

from torchplace.devices import DeviceProperties, FakeProbe

GiB = 2**30

H200 = DeviceProperties("NVIDIA H200", 9, 0, 141 * GiB, 132, "GPU-aaaa1111-0000")
L4 = DeviceProperties("NVIDIA L4", 8, 9, 24 * GiB, 58, "GPU-bbbb2222-0000")
T4 = DeviceProperties("Tesla T4", 7, 5, 16 * GiB, 40, "GPU-cccc3333-0000")
MIG = DeviceProperties("NVIDIA H200 MIG 1g.18gb", 9, 0, 18 * GiB, 16, "MIG-dddd4444-0000")


def gpus(*devices: DeviceProperties, env: dict[str, str] | None = None, **kw: object) -> FakeProbe:
    return FakeProbe(
        devices=list(devices),
        cuda_version="12.8",
        version="2.13.0+cu128",
        env_vars=env or {},
        **kw,  # type: ignore[arg-type]
    )


CPU_ONLY = FakeProbe()

MI300X = [
    DeviceProperties(f"AMD Instinct MI300X #{i}", 9, 4, 192 * GiB, 304, f"GPU-{i}b2c1a9f8d3e6f7{i}")
    for i in range(4)
]


def rocm(**env: str) -> FakeProbe:
    """Four MI300X under a ROCm build of torch, with ``env`` as the process environment."""
    return FakeProbe(devices=MI300X, hip_version="6.2", version="2.13.0+rocm6.2", env_vars=env)
