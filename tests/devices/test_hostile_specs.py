"""Hostile device specs and ``CUDA_VISIBLE_DEVICES`` values: each is a clear error or a documented
reading, never a traceback, a wrapped index or a silent guess. Where torchplace and
``torch.device`` read a spec differently, the test says which and why."""

from __future__ import annotations

import pytest
import torch

from torchplace.devices import (
    DEVICE_ENV_VAR,
    DeviceProperties,
    FakeProbe,
    cuda_unavailable_reason,
    resolve_device,
    visible_devices,
)
from torchplace.errors import ConfigError, DeviceIndexError, DeviceUnavailableError

from .machines import H200, L4, T4, GiB, gpus


def _torch_takes(spec: object) -> bool:
    try:
        torch.device(spec)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        return False
    return True


# -- specs torch and torchplace both take, or both refuse -------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected", "torch_takes"),
    [
        # looser than torch.device on purpose (documented): case, spaces, leading zeros
        ("cuda:01", "cuda:1", False),
        ("CUDA", "cuda:0", False),
        (" cpu", "cpu", False),
        # torch takes them; tensors on them report plain cpu / meta, and so do we
        ("cpu:0", "cpu", True),
        ("cpu:1", "cpu", True),
        ("meta:1", "meta", True),
        ("meta", "meta", True),
    ],
)
def test_loose_spellings_resolve_to_what_torch_reports(
    spec: str, expected: str, torch_takes: bool
) -> None:
    assert _torch_takes(spec) is torch_takes
    assert resolve_device(spec, probe=gpus(H200, L4)) == torch.device(expected)


@pytest.mark.parametrize("spec", ["cuda:", "cuda:0:1", "cuda:-1", "cuda:٣", "cuda: 1", "cuda:+1"])
def test_specs_torch_refuses_are_refused(spec: str) -> None:
    assert not _torch_takes(spec)
    with pytest.raises(ConfigError):
        resolve_device(spec, probe=gpus(H200, L4))


# -- indices torch cannot hold ----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    ["cuda:" + "1" * 5000, 10**5000, "1" * 5000, "cuda:128", 200, "xpu:999"],
    ids=["cuda:5000-digits", "int-5000-digits", "5000-digits", "cuda:128", "200", "xpu:999"],
)
def test_an_index_past_what_torch_can_hold_is_a_config_error_not_a_crash(spec: object) -> None:
    # was ValueError: "Exceeds the limit (4300 digits) for integer string conversion"; and
    # torch.device keeps an index in 8 bits, so torch.device("cuda", 128) is cuda:-128
    with pytest.raises(ConfigError, match="127") as info:
        resolve_device(spec, probe=gpus(H200, L4, backends={"xpu": 1}))  # type: ignore[arg-type]
    assert len(str(info.value)) < 400


def test_an_index_torch_can_hold_but_past_the_gpus_still_lists_them() -> None:
    with pytest.raises(DeviceIndexError, match="cuda:1 = physical 1"):
        resolve_device("cuda:127", probe=gpus(H200, L4))


# -- very long specs --------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["x" * 100_000, "cuda:" + "x" * 100_000, " " * 50_000 + "cuda:1x"])
def test_a_very_long_spec_is_shortened_in_the_message(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(spec, probe=gpus(H200))
    assert len(str(info.value)) < 400
    assert "characters" in str(info.value)


def test_a_very_long_environment_variable_is_shortened_too() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(probe=gpus(H200, env={DEVICE_ENV_VAR: "gpu" * 30_000}))
    assert DEVICE_ENV_VAR in str(info.value)
    assert len(str(info.value)) < 600


# -- numbers that are not Python ints ---------------------------------------------------------


class _Index:
    """An integer-like object (``__index__``), as numpy's integers are."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_integer_like_objects_are_indices_as_torch_takes_them() -> None:
    probe = gpus(H200, L4)
    assert resolve_device(_Index(1), probe=probe) == torch.device("cuda", 1)  # type: ignore[arg-type]
    np = pytest.importorskip("numpy")
    assert torch.device("cuda", np.int64(1)) == torch.device("cuda", 1)  # torch takes numpy's
    free = np.array([3, 9])
    assert resolve_device(np.argmax(free), probe=probe) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="negative"):
        resolve_device(np.int64(-1), probe=probe)
    with pytest.raises(ConfigError, match="bool"):
        resolve_device(np.True_, probe=probe)
    with pytest.raises(ConfigError, match="float64"):
        resolve_device(np.float64(1.0), probe=probe)


# -- -1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["-1", -1, " -1 ", "-01"])
def test_minus_one_is_negative_and_the_message_points_at_cpu(spec: object) -> None:
    # many scripts use --gpu -1 for "the CPU"; torch refuses a negative index
    with pytest.raises(ConfigError, match="negative") as info:
        resolve_device(spec, probe=gpus(H200))  # type: ignore[arg-type]
    assert "'cpu'" in str(info.value)


# -- device types torch knows but resolve_device does not check --------------------------------


@pytest.mark.parametrize(
    "spec", ["privateuseone", "xla", "xla:0", "hpu", "mtia", "mkldnn", torch.device("xla")]
)
def test_a_device_type_torch_knows_is_named_as_such(spec: object) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(spec, probe=gpus(H200))  # type: ignore[arg-type]
    message = str(info.value)
    assert "torch knows" in message
    assert "resolve_device" in message


@pytest.mark.parametrize("spec", ["tpu", "gpu", "tpu:0"])
def test_a_device_type_torch_does_not_know_is_named_as_such(spec: str) -> None:
    assert not _torch_takes(spec)
    with pytest.raises(ConfigError, match="not a device type torch knows"):
        resolve_device(spec, probe=gpus(H200))


# -- garbage from a probe ---------------------------------------------------------------------


def test_a_current_device_past_the_visible_ones_is_not_returned() -> None:
    probe = gpus(H200, L4, current=5)  # a probe (or a runtime) that answers nonsense
    with pytest.raises(DeviceIndexError, match="current device 5"):
        resolve_device("cuda", probe=probe)
    with pytest.raises(DeviceIndexError, match="current device 5"):
        resolve_device("auto", probe=probe)


# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "it is empty"),
        ("   ", "it is empty"),
        ("-1", "-1 hides every GPU"),
        ("0,0", "names GPU 0 twice"),
        ("1, 1", "names GPU 1 twice"),
        ("GPU-aaaa1111,GPU-aaaa1111", "names GPU GPU-aaaa1111 twice"),
        ("NoDevFiles", "job scheduler"),
        ("all", "NVIDIA_VISIBLE_DEVICES"),
        ("none", "NVIDIA_VISIBLE_DEVICES"),
        ("abc", "'abc' is not a GPU index or UUID"),
        ("٣", "'٣' is not a GPU index or UUID"),
    ],
)
def test_hiding_every_gpu_says_why(value: str, why: str) -> None:
    probe = gpus(H200, L4, env={"CUDA_VISIBLE_DEVICES": value})
    assert visible_devices(probe=probe).hides_all
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda", probe=probe)
    assert why in str(info.value)


@pytest.mark.parametrize(
    ("value", "ids", "stopped_at", "ignored"),
    [
        ("0,1", ("0", "1"), None, ()),
        ("0,1,", ("0", "1"), "", ()),  # a trailing comma loses nothing
        ("0,,1", ("0",), "", ("1",)),
        ("0,-1,2", ("0",), "-1", ("-1", "2")),
        ("0, gpu1", ("0",), "gpu1", ("gpu1",)),
    ],
)
def test_visible_devices_says_where_reading_stopped(
    value: str, ids: tuple[str, ...], stopped_at: str | None, ignored: tuple[str, ...]
) -> None:
    vis = visible_devices(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": value}))
    assert vis.physical_ids == ids
    assert vis.stopped_at == stopped_at
    assert vis.ignored == ignored


def test_cuda_enumerates_one_mig_device_per_process() -> None:
    mig_a = DeviceProperties("NVIDIA H200 MIG 1g.18gb", 9, 0, 18 * GiB, 16, "MIG-aaaa0000-0001")
    mig_b = DeviceProperties("NVIDIA H200 MIG 1g.18gb", 9, 0, 18 * GiB, 16, "MIG-bbbb0000-0002")
    probe = gpus(mig_a, mig_b, env={"CUDA_VISIBLE_DEVICES": "MIG-aaaa0000,MIG-bbbb0000"})
    assert probe.device_count() == 1
    assert probe.properties(0).uuid == mig_a.uuid


@pytest.mark.parametrize("value", ["void", "none", ""])
def test_a_container_started_without_gpus_is_named(value: str) -> None:
    probe = FakeProbe(cuda_version="12.8", env_vars={"NVIDIA_VISIBLE_DEVICES": value})
    problem = cuda_unavailable_reason(probe)
    assert problem is not None
    assert f"NVIDIA_VISIBLE_DEVICES={value!r}" in problem[0]
    assert "container" in problem[0]
    with pytest.raises(DeviceUnavailableError, match="NVIDIA_VISIBLE_DEVICES"):
        resolve_device("cuda:0", probe=probe)


def test_visible_indices_count_the_containers_gpus_from_zero() -> None:
    # NVIDIA_VISIBLE_DEVICES=2,3 gave the container two GPUs, numbered 0 and 1 inside it
    probe = gpus(H200, T4, env={"NVIDIA_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "2"})
    problem = cuda_unavailable_reason(probe)
    assert problem is not None
    assert "NVIDIA_VISIBLE_DEVICES='2,3'" in problem[0] + problem[1]
    assert "from 0" in problem[0] + problem[1]


def test_a_visibility_index_of_thousands_of_digits_is_read_without_a_crash() -> None:
    # was ValueError: "Exceeds the limit (4300 digits) for integer string conversion"
    probe = gpus(H200, env={"CUDA_VISIBLE_DEVICES": "0," + "1" * 5000})
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("0", "1" * 5000)
    assert probe.device_count() == 1
    assert resolve_device("cuda", probe=probe) == torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("probe", "error"),
    [
        (FakeProbe(env_vars={DEVICE_ENV_VAR: "cuda:01"}), DeviceUnavailableError),
        (gpus(H200, env={DEVICE_ENV_VAR: "cuda:1"}), DeviceIndexError),
    ],
)
def test_auto_that_fails_through_the_environment_names_the_variable(
    probe: FakeProbe, error: type[Exception]
) -> None:
    # was "cannot use 'cuda:1': ... CPU-only build": a user who asked for "auto" (which falls
    # back to the CPU) was not told that $TORCHPLACE_DEVICE asked for the GPU
    with pytest.raises(error) as info:
        resolve_device("auto", probe=probe)
    assert f"${DEVICE_ENV_VAR}=" in str(info.value)
    assert f"unset {DEVICE_ENV_VAR}" in str(info.value)
