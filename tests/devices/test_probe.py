"""The real probe against torch (and NVML), and that importing never initialises CUDA."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import pytest
import torch

import torchplace
from torchplace.devices import (
    DEVICE_ENV_VAR,
    DeviceProbe,
    DriverInfo,
    FakeProbe,
    TorchProbe,
    device_inventory,
    resolve_device,
    visible_devices,
)
from torchplace.errors import (
    DeviceUnavailableError,
)

from .machines import GiB

# -- the real probe ---------------------------------------------------------------------------


def test_probes_satisfy_the_protocol() -> None:
    assert isinstance(TorchProbe(), DeviceProbe)
    assert isinstance(FakeProbe(), DeviceProbe)


def test_real_probe_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = TorchProbe()
    assert probe.cuda_build() == torch.version.cuda
    assert probe.torch_version() == torch.__version__
    assert probe.cuda_available() == torch.cuda.is_available()
    cuda = [d for d in device_inventory() if d.device.startswith("cuda")]
    assert len(cuda) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert visible_devices().physical_ids == ("3", "1")
    monkeypatch.setenv(DEVICE_ENV_VAR, "meta")
    assert resolve_device() == torch.device("meta")
    assert torchplace.resolve_device("cpu") == torch.device("cpu")


def test_real_probe_driver_reports_why_when_missing() -> None:
    info = TorchProbe().driver()
    assert isinstance(info, DriverInfo)
    assert info.driver_version is not None or info.error is not None


def test_real_probe_reads_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # TorchProbe.driver() against nvidia-ml-py's API as an NVIDIA driver answers it
    pynvml = pytest.importorskip("pynvml")
    calls: list[str] = []
    answers = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlSystemGetDriverVersion": lambda: "580.95.05",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA L4",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}{h}{h}{h}",
    }
    for name, fake in answers.items():
        monkeypatch.setattr(pynvml, name, fake)
    info = TorchProbe().driver()
    assert info == DriverInfo(
        nvml_installed=True,
        driver_version="580.95.05",
        cuda_driver_version="13.0",
        physical_gpu_count=2,
        physical_gpus=("0: NVIDIA H200 (GPU-0000)", "1: NVIDIA L4 (GPU-1111)"),
    )
    assert calls == ["init", "shutdown"]

    def broken(handle: int) -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", broken)
    lost = TorchProbe().driver()
    assert lost.nvml_installed
    assert lost.error is not None
    assert lost.error.startswith("NVML query failed")
    assert calls[-1] == "shutdown"


@pytest.mark.cuda
def test_cuda_nvml_agrees_with_torch() -> None:
    with warnings.catch_warnings():
        # the old "pynvml" shim package warns on import that nvidia-ml-py replaces it
        warnings.simplefilter("ignore", FutureWarning)
        pytest.importorskip("pynvml")
        info = TorchProbe().driver()
    assert info.error is None, info.error
    assert info.driver_version
    assert re.fullmatch(r"\d+\.\d+", info.cuda_driver_version or "")
    assert info.physical_gpu_count is not None
    assert info.physical_gpu_count >= torch.cuda.device_count()
    nvml = " ".join(info.physical_gpus)
    for dev in device_inventory():
        assert dev.name in nvml
        if dev.uuid is not None and dev.uuid.startswith("GPU-"):
            assert dev.uuid in nvml  # the same UUID NVML and nvidia-smi print


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_real_cpu_only_machine() -> None:
    assert resolve_device() == torch.device("cpu")
    assert device_inventory() == []
    with pytest.raises(DeviceUnavailableError):
        resolve_device("cuda:0")


def test_import_does_not_initialise_cuda() -> None:
    code = (
        "import torchplace.devices, torchplace.doctor, torch; "
        "torchplace.devices.default_probe(); print(torch.cuda.is_initialized())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"


class _Uuid:
    """Stands in for torch's ``_CUuuid``: str() gives the bare 8-4-4-4-12 hex form."""

    def __str__(self) -> str:
        return "aaaa1111-2222-3333-4444-555566667777"


@pytest.mark.parametrize("hip", [None, "6.4"])
def test_torch_probe_reads_cuda_properties(
    monkeypatch: pytest.MonkeyPatch, hip: str | None
) -> None:
    # The real probe on CPU, with torch.cuda's answers replaced by what a CUDA (or ROCm) build
    # gives on a GPU: CUDA aliases gcnArchName to the device name; ROCm puts the gfx arch there.
    import types

    props = types.SimpleNamespace(
        name="NVIDIA H200",
        major=9,
        minor=0,
        total_memory=141 * GiB,
        multi_processor_count=132,
        uuid=_Uuid(),
        pci_domain_id=0,
        pci_bus_id=0x3B,
        pci_device_id=0,
        L2_cache_size=50 << 20,
        is_integrated=0,
        gcnArchName="gfx942:sramecc+:xnack-" if hip else "NVIDIA H200",
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.version, "hip", hip)
    got = TorchProbe().properties(0)
    assert got.name == "NVIDIA H200"
    assert (got.major, got.minor) == (9, 0)
    assert got.total_memory == 141 * GiB
    assert got.multi_processor_count == 132
    assert got.pci_bus_id == "00000000:3b:00.0"
    assert got.l2_cache_size == 50 << 20
    assert got.is_integrated is False
    if hip:
        assert got.uuid == "aaaa1111-2222-3333-4444-555566667777"
        assert got.gcn_arch_name == "gfx942:sramecc+:xnack-"
    else:
        assert got.uuid == "GPU-aaaa1111-2222-3333-4444-555566667777"
        assert got.gcn_arch_name is None
