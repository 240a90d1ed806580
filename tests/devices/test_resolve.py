"""Spec parsing and resolution: one explicit device, or an error naming what is visible and the fix."""

from __future__ import annotations

import os

import pytest
import torch

from torchplace.devices import (
    DEVICE_ENV_VAR,
    DriverInfo,
    FakeProbe,
    cuda_unavailable_reason,
    resolve_device,
    visible_devices,
)
from torchplace.errors import (
    ConfigError,
    DeviceError,
    DeviceIndexError,
    DeviceUnavailableError,
)

from .machines import CPU_ONLY, H200, L4, T4, gpus

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


@pytest.mark.parametrize("spec", ["cpu:0", torch.device("cpu", 0), "meta:0"])
def test_cpu_and_meta_come_back_as_tensors_report_them(spec: str | torch.device) -> None:
    got = resolve_device(spec, probe=FakeProbe())
    assert got.index is None
    assert torch.empty(1, device=got).device == got  # so a plain == check does not misfire


@pytest.mark.parametrize("spec", ["٣", "cuda:٣", "１"])
def test_digits_of_other_scripts_are_not_indices(spec: str) -> None:
    with pytest.raises(ConfigError, match="is not understood"):
        resolve_device(spec, probe=FakeProbe())
