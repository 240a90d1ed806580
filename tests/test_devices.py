"""Device resolution and inventory, on fakes of many machines and on the real one."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchplace
from torchplace.devices import (
    DEVICE_ENV_VAR,
    DeviceProbe,
    DeviceProperties,
    DriverInfo,
    FakeProbe,
    TorchProbe,
    cuda_unavailable_reason,
    device_inventory,
    parse_visible_devices,
    resolve_device,
    visible_devices,
)
from torchplace.errors import (
    ConfigError,
    DeviceError,
    DeviceIndexError,
    DeviceUnavailableError,
)

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


# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("0", ["0"]),
        ("2,0", ["2", "0"]),
        (" 1 , 3 ", ["1", "3"]),
        ("0,-1,2", ["0"]),  # CUDA stops at the first invalid entry
        ("1gpu,2", ["1", "2"]),  # strtoul-like
        ("0,0", []),  # a repeated entry hides everything
        ("abc", []),
        ("GPU-aaaa,GPU-bbbb", ["GPU-aaaa", "GPU-bbbb"]),
        ("MIG-dddd4444-0000", ["MIG-dddd4444-0000"]),
        ("MIG-GPU-aaaa/1/0", ["MIG-GPU-aaaa/1/0"]),
    ],
)
def test_parse_visible_devices(value: str | None, expected: list[str] | None) -> None:
    assert parse_visible_devices(value) == expected


@given(st.lists(st.integers(min_value=0, max_value=63), unique=True, max_size=8))
def test_parse_visible_devices_roundtrips_distinct_ordinals(ordinals: list[int]) -> None:
    value = ",".join(str(i) for i in ordinals)
    assert parse_visible_devices(value) == [str(i) for i in ordinals]


def test_visible_devices_describes_the_variable() -> None:
    vis = visible_devices(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": "-1"}))
    assert vis.hides_all
    assert vis.describe() == "CUDA_VISIBLE_DEVICES='-1'"
    unset = visible_devices(probe=gpus(H200))
    assert not unset.hides_all
    assert unset.physical_id(3) == "3"
    assert unset.describe() == "CUDA_VISIBLE_DEVICES unset"


def test_rocm_build_reads_hip_visible_devices() -> None:
    probe = FakeProbe(devices=[H200, L4], hip_version="6.2", env_vars={"HIP_VISIBLE_DEVICES": "1"})
    assert visible_devices(probe=probe).variable == "HIP_VISIBLE_DEVICES"
    assert [d.name for d in device_inventory(probe=probe)] == ["NVIDIA L4"]


# -- inventory --------------------------------------------------------------------------------


def test_inventory_remaps_logical_to_physical() -> None:
    probe = gpus(H200, L4, T4, env={"CUDA_VISIBLE_DEVICES": "2,0"}, free_memory={1: 100 * GiB})
    inv = device_inventory(probe=probe)
    assert [(d.device, d.index, d.physical_id, d.name) for d in inv] == [
        ("cuda:0", 0, "2", "Tesla T4"),
        ("cuda:1", 1, "0", "NVIDIA H200"),
    ]
    t4, h200 = inv
    assert t4.capability == (7, 5)
    assert t4.sm == "sm_75"
    assert t4.total_memory == t4.free_memory == 16 * GiB
    assert h200.free_memory == 100 * GiB
    assert h200.total_memory == 141 * GiB
    assert h200.multi_processor_count == 132
    assert h200.uuid == H200.uuid


def test_inventory_without_visibility_variable_is_identity() -> None:
    inv = device_inventory(probe=gpus(H200, L4))
    assert [(d.index, d.physical_id) for d in inv] == [(0, "0"), (1, "1")]


def test_inventory_with_uuid_and_mig_entries() -> None:
    probe = gpus(H200, T4, MIG, env={"CUDA_VISIBLE_DEVICES": "MIG-dddd4444,GPU-aaaa1111"})
    inv = device_inventory(probe=probe)
    assert [(d.device, d.physical_id, d.name) for d in inv] == [
        ("cuda:0", "MIG-dddd4444", MIG.name),
        ("cuda:1", "GPU-aaaa1111", H200.name),
    ]


def test_inventory_stops_at_unknown_physical_index() -> None:
    # "0,7" on a two-GPU machine: CUDA shows only GPU 0
    inv = device_inventory(probe=gpus(H200, L4, env={"CUDA_VISIBLE_DEVICES": "0,7,1"}))
    assert [d.physical_id for d in inv] == ["0"]


def test_inventory_is_empty_without_accelerators() -> None:
    assert device_inventory(probe=CPU_ONLY) == []
    assert device_inventory(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": ""})) == []


def test_inventory_lists_mps() -> None:
    inv = device_inventory(probe=FakeProbe(backends={"mps": 1}))
    assert [(d.device, d.name, d.capability) for d in inv] == [("mps:0", "MPS", None)]


def test_device_info_is_frozen_and_serialisable() -> None:
    (info,) = device_inventory(probe=gpus(H200))
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "x"  # type: ignore[misc]
    data = json.loads(json.dumps(info.to_dict()))
    assert data["capability"] == "9.0"
    assert data["sm"] == "sm_90"
    assert data["physical_id"] == "0"
    assert data["total_memory"] == 141 * GiB
    assert isinstance(info, torchplace.DeviceInfo)


# -- resolve_device ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("auto", "cuda:0"),
        (None, "cuda:0"),
        ("cuda", "cuda:0"),
        ("cuda:1", "cuda:1"),
        (" CUDA:1 ", "cuda:1"),
        (1, "cuda:1"),
        ("1", "cuda:1"),
        (torch.device("cuda", 1), "cuda:1"),
        (torch.device("cuda"), "cuda:0"),
        ("cpu", "cpu"),
        ("meta", "meta"),
        (torch.device("cpu"), "cpu"),
    ],
)
def test_resolve_on_two_gpus(spec: object, expected: str) -> None:
    got = resolve_device(spec, probe=gpus(H200, L4))  # type: ignore[arg-type]
    assert got == torch.device(expected)
    if got.type == "cuda":
        assert got.index is not None


def test_cuda_resolves_to_the_current_device() -> None:
    probe = gpus(H200, L4, current=1)
    assert resolve_device("cuda", probe=probe) == torch.device("cuda", 1)
    assert resolve_device("auto", probe=probe) == torch.device("cuda", 1)


def test_auto_is_cpu_on_a_cpu_only_build() -> None:
    assert resolve_device(probe=CPU_ONLY) == torch.device("cpu")


def test_auto_picks_mps_or_xpu_when_there_is_no_cuda() -> None:
    assert resolve_device(probe=FakeProbe(backends={"mps": 1})) == torch.device("mps", 0)
    assert resolve_device(probe=FakeProbe(backends={"xpu": 2})) == torch.device("xpu", 0)
    assert resolve_device("xpu:1", probe=FakeProbe(backends={"xpu": 2})) == torch.device("xpu", 1)
    # CUDA wins when both are present
    both = gpus(H200, backends={"mps": 1})
    assert resolve_device(probe=both) == torch.device("cuda", 0)


def test_out_of_range_index_lists_what_is_visible() -> None:
    probe = gpus(H200, L4, T4, env={"CUDA_VISIBLE_DEVICES": "2,0"})
    with pytest.raises(DeviceIndexError) as info:
        resolve_device("cuda:2", probe=probe)
    msg = str(info.value)
    assert "2 CUDA device(s) visible" in msg
    assert "CUDA_VISIBLE_DEVICES='2,0'" in msg
    assert "cuda:0 = physical 2 (Tesla T4)" in msg
    assert "cuda:1 = physical 0 (NVIDIA H200)" in msg
    assert "from 0 to 1" in msg
    assert isinstance(info.value, IndexError)
    assert isinstance(info.value, DeviceError)
    with pytest.raises(DeviceIndexError):
        resolve_device(7, probe=probe)


def test_cuda_1_on_a_one_gpu_machine() -> None:
    with pytest.raises(DeviceIndexError) as info:
        resolve_device("cuda:1", probe=gpus(H200))
    assert str(info.value) == (
        "cannot use 'cuda:1': 1 CUDA device(s) visible (CUDA_VISIBLE_DEVICES unset): "
        "cuda:0 = physical 0 (NVIDIA H200). Fix: use an index from 0 to 0, or make more GPUs "
        "visible through CUDA_VISIBLE_DEVICES."
    )
    assert resolve_device("cuda", probe=gpus(H200)) == torch.device("cuda", 0)
    assert resolve_device("cuda:0", probe=gpus(H200)) == torch.device("cuda", 0)


def test_cpu_only_build_names_the_build_and_the_fix() -> None:
    for spec in ("cuda", "cuda:0", 0, torch.device("cuda", 0)):
        with pytest.raises(DeviceUnavailableError) as info:
            resolve_device(spec, probe=CPU_ONLY)
        msg = str(info.value)
        assert "CPU-only build" in msg
        assert "torch.version.cuda is None" in msg
        assert "2.13.0+cpu" in msg
        assert "pip install torch --index-url" in msg


@pytest.mark.parametrize("value", ["", "-1", "0,0"])
def test_visible_devices_hiding_everything(value: str) -> None:
    probe = gpus(H200, L4, env={"CUDA_VISIBLE_DEVICES": value})
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda", probe=probe)
    assert f"CUDA_VISIBLE_DEVICES={value!r}" in str(info.value)
    assert "hides every GPU" in str(info.value)
    assert "unset CUDA_VISIBLE_DEVICES" in str(info.value)
    # "auto" still works: it falls back to the CPU
    assert resolve_device("auto", probe=probe) == torch.device("cpu")


def test_cuda_build_without_a_driver() -> None:
    probe = FakeProbe(
        cuda_version="12.8",
        driver_info=DriverInfo(nvml_installed=True, error="NVML unavailable: no driver"),
    )
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda:0", probe=probe)
    msg = str(info.value)
    assert "built for CUDA 12.8 but no CUDA device is usable" in msg
    assert "NVML unavailable" in msg
    assert "nvidia-smi" in msg


def test_gpus_present_but_visibility_matches_none() -> None:
    probe = gpus(
        H200,
        env={"CUDA_VISIBLE_DEVICES": "5"},
        driver_info=DriverInfo(nvml_installed=True, physical_gpu_count=1),
    )
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda", probe=probe)
    assert "NVML sees 1 GPU(s) but CUDA_VISIBLE_DEVICES='5' matches none" in str(info.value)


def test_mps_unavailable_and_out_of_range() -> None:
    with pytest.raises(DeviceUnavailableError, match="no usable mps device"):
        resolve_device("mps", probe=CPU_ONLY)
    with pytest.raises(DeviceIndexError, match="1 mps device"):
        resolve_device("mps:1", probe=FakeProbe(backends={"mps": 1}))


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "cuda:x",
        "tpu",
        "gpu",
        "auto:0",
        "cuda:-1",
        "cuda:0:1",
        -1,
        True,
        1.5,
        ["cuda"],
        torch.device("hpu"),
    ],
)
def test_bad_specs_are_config_errors(spec: object) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(spec, probe=gpus(H200))  # type: ignore[arg-type]
    assert repr(spec) in str(info.value) or str(spec) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_env_var_is_honoured_by_auto_only() -> None:
    probe = gpus(H200, L4, env={DEVICE_ENV_VAR: "cuda:1"})
    assert resolve_device(probe=probe) == torch.device("cuda", 1)
    assert resolve_device("auto", probe=probe) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", probe=probe) == torch.device("cuda", 0)
    assert resolve_device(probe=gpus(H200, env={DEVICE_ENV_VAR: "cpu"})) == torch.device("cpu")
    assert resolve_device(probe=gpus(H200, env={DEVICE_ENV_VAR: "auto"})) == torch.device("cuda", 0)


def test_env_var_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=f"{DEVICE_ENV_VAR}='gpu0'"):
        resolve_device(probe=gpus(H200, env={DEVICE_ENV_VAR: "gpu0"}))
    with pytest.raises(DeviceUnavailableError, match="CPU-only"):
        resolve_device(probe=FakeProbe(env_vars={DEVICE_ENV_VAR: "cuda"}))


def test_cuda_unavailable_reason() -> None:
    assert cuda_unavailable_reason(gpus(H200)) is None
    problem = cuda_unavailable_reason(FakeProbe(env_vars={"CUDA_VISIBLE_DEVICES": ""}))
    assert problem is not None
    reason, fix = problem
    assert "CPU-only" in reason
    assert "CUDA_VISIBLE_DEVICES=''" in reason
    assert "pip install torch" in fix


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


# -- real CUDA --------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_resolves_with_index() -> None:
    assert resolve_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(0) == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", torch.cuda.current_device())
    if DEVICE_ENV_VAR not in os.environ:
        assert resolve_device("auto") == torch.device("cuda", torch.cuda.current_device())
    count = torch.cuda.device_count()
    with pytest.raises(DeviceIndexError) as info:
        resolve_device(f"cuda:{count}")  # cuda:1 on a one-GPU machine
    msg = str(info.value)
    assert f"cannot use 'cuda:{count}': {count} CUDA device(s) visible" in msg
    assert f"cuda:0 = physical {visible_devices().physical_id(0)}" in msg
    assert torch.cuda.get_device_name(0) in msg
    assert f"use an index from 0 to {count - 1}" in msg
    with pytest.raises(DeviceIndexError):
        resolve_device(count)


@pytest.mark.cuda
def test_cuda_inventory_matches_torch() -> None:
    inv = device_inventory()
    assert len(inv) == torch.cuda.device_count()
    vis = visible_devices()
    for i, info in enumerate(inv):
        props = torch.cuda.get_device_properties(i)
        assert info.device == f"cuda:{i}"
        assert info.index == i
        assert info.name == props.name
        assert info.capability == torch.cuda.get_device_capability(i)
        assert info.total_memory == props.total_memory
        assert info.free_memory is not None
        assert 0 < info.free_memory <= props.total_memory
        assert info.physical_id == vis.physical_id(i)
        assert info.multi_processor_count == props.multi_processor_count
        if torch.version.hip is None:
            # CUDA builds alias gcnArchName to the name: it must not pass for an arch
            assert info.arch is None
            assert info.uuid is not None
            assert info.uuid.startswith(("GPU-", "MIG-"))
        if info.pci_bus_id is not None:
            assert re.fullmatch(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.0", info.pci_bus_id)


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
