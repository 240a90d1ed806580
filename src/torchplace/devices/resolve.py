"""Device resolution: :func:`resolve_device` turns a spec into one explicit :class:`torch.device`
with its index, or raises an error that says what is visible and how to fix it;
:func:`cuda_unavailable_reason` says why CUDA cannot be used here.
"""

from __future__ import annotations

import torch

from torchplace.devices.probe import DeviceProbe, checked_probe, cuda_built
from torchplace.devices.spec import OTHER_ACCELERATORS, PASS_THROUGH, parse_spec, shown
from torchplace.devices.visible import visible_devices
from torchplace.errors import ConfigError, DeviceError, DeviceIndexError, DeviceUnavailableError

__all__ = ["DEVICE_ENV_VAR", "cuda_unavailable_reason", "resolve_device"]


DEVICE_ENV_VAR = "TORCHPLACE_DEVICE"
"""Environment variable that ``resolve_device("auto")`` honours before looking at hardware."""

_CUDA_WHEEL_FIX = (
    "install a CUDA build of torch, e.g. "
    "'pip install torch --index-url https://download.pytorch.org/whl/cu128' "
    "(pick the CUDA version your driver supports, see https://pytorch.org/get-started/locally/), "
    "or ask for device 'cpu'"
)


def resolve_device(
    spec: str | torch.device | int | None = "auto", *, probe: DeviceProbe | None = None
) -> torch.device:
    """Turn a device spec into one explicit :class:`torch.device`, with its index.

    - ``"auto"`` / None: ``$TORCHPLACE_DEVICE`` if set; else the first usable accelerator
      (``cuda:N`` with N the current device, normally 0; else ``mps:0`` or ``xpu:N``); else
      ``cpu``.
    - ``"cuda"`` -> ``cuda:N`` (the current device); ``"cuda:1"`` or ``1`` -> ``cuda:1``.
    - ``"cpu"`` and ``"meta"`` come back without an index, as tensors report them (``"cpu:0"``
      -> ``cpu``), so ``tensor.device == resolve_device(spec)`` holds for a tensor there.

    Raises :class:`~torchplace.errors.DeviceUnavailableError` when the backend is not usable (a
    CPU-only torch build, ``CUDA_VISIBLE_DEVICES`` hiding every GPU, no driver),
    :class:`~torchplace.errors.DeviceIndexError` for an index past the visible devices and
    :class:`~torchplace.errors.ConfigError` for a spec that does not parse.
    """
    probe = checked_probe(probe)
    kind, index = parse_spec(spec)
    if kind == "auto":
        from_env = probe.env(DEVICE_ENV_VAR)
        if from_env is not None and from_env.strip() and from_env.strip().lower() != "auto":
            try:
                return resolve_device(from_env, probe=probe)
            except ConfigError as exc:
                raise ConfigError(f"${DEVICE_ENV_VAR}={shown(from_env)}: {exc}") from exc
            except DeviceError as exc:  # "auto" alone would fall back to the CPU: say who asked
                raise type(exc)(
                    f"${DEVICE_ENV_VAR}={shown(from_env)} (read by 'auto'): "
                    f"{str(exc).rstrip('.')}, or unset {DEVICE_ENV_VAR} to let 'auto' choose."
                ) from exc
        return _auto(probe)
    if kind in PASS_THROUGH:
        return torch.device(kind)  # as tensors report it: torch.device("cpu", 0) != cpu
    if kind == "cuda":
        return _resolve_cuda(index, probe)
    return _resolve_other(kind, index, probe)


def _auto(probe: DeviceProbe) -> torch.device:
    if cuda_built(probe) and probe.cuda_available() and probe.device_count() > 0:
        return _current("cuda", probe.current_device(), probe.device_count(), probe)
    preferred = probe.accelerator()
    kinds = [k for k in OTHER_ACCELERATORS if k == preferred] + [
        k for k in OTHER_ACCELERATORS if k != preferred
    ]
    for kind in kinds:
        count = probe.backend_device_count(kind) if probe.backend_available(kind) else 0
        if count > 0:
            return _current(kind, probe.backend_current_index(kind), count, probe)
    return torch.device("cpu")


def _build_name(probe: DeviceProbe) -> str:
    return f"torch {probe.torch_version()}"


def cuda_unavailable_reason(probe: DeviceProbe | None = None) -> tuple[str, str] | None:
    """Why CUDA cannot be used here, as (reason, fix); None when it can."""
    probe = checked_probe(probe)
    vis = visible_devices(probe=probe)
    if not cuda_built(probe):
        reason = (
            f"{_build_name(probe)} is a CPU-only build (torch.version.cuda is None), "
            "so no CUDA device can be used"
        )
        if vis.value is not None:
            reason += f" ({vis.describe()} as well)"
        return reason, _CUDA_WHEEL_FIX
    if vis.hides_all:
        return (
            f"{vis.describe()} hides every GPU from this process: {vis.why_hidden()}",
            f"unset {vis.variable} or list the GPUs to use, e.g. {vis.variable}=0",
        )
    if not probe.cuda_available() or probe.device_count() == 0:
        drv = probe.driver()
        seen = ""
        if drv.physical_gpu_count:
            seen = f"; NVML sees {drv.physical_gpu_count} GPU(s)"
            if vis.value is not None:
                seen += f" but {vis.describe()} matches none of them"
        elif drv.error:
            seen = f"; {drv.error}"
        seen += _container_hint(probe, vis.value is not None)
        build = probe.cuda_build() or f"HIP {probe.hip_build()}"
        return (
            f"{_build_name(probe)} is built for CUDA {build} but no CUDA device is usable{seen}",
            "check that 'nvidia-smi' lists a GPU and the driver supports CUDA "
            f"{build}; in a container, run it with GPU access (e.g. 'docker run --gpus all')"
            + (f"; check {vis.describe()}" if vis.value is not None else ""),
        )
    return None


_NO_GPU_CONTAINER = ("", "none", "void")


def _container_hint(probe: DeviceProbe, visibility_set: bool) -> str:
    """What ``NVIDIA_VISIBLE_DEVICES`` (read by the NVIDIA container runtime when a container
    starts) says about a machine where CUDA sees no device."""
    nvidia = probe.env("NVIDIA_VISIBLE_DEVICES")
    if nvidia is None:
        return ""
    if nvidia.strip().lower() in _NO_GPU_CONTAINER:
        return f"; NVIDIA_VISIBLE_DEVICES={nvidia!r}: this container was started without a GPU"
    if visibility_set and nvidia.strip().lower() != "all":
        given = len([e for e in nvidia.split(",") if e.strip()])
        return (
            "; inside a container, CUDA_VISIBLE_DEVICES counts the container's own GPUs from 0 "
            f"(NVIDIA_VISIBLE_DEVICES={nvidia!r} gave it {given})"
        )
    return ""


def _current(kind: str, index: int, count: int, probe: DeviceProbe) -> torch.device:
    """The backend's current device, checked against the devices it says are visible."""
    if 0 <= index < count:
        return torch.device(kind, index)
    listing = _listing(probe, count) if kind == "cuda" else f"{count} {kind} device(s)"
    raise DeviceIndexError(
        f"cannot use {kind!r}: the runtime's current device {index} is not one of the "
        f"{count} visible ({listing}). Fix: ask for '{kind}:0', or set the current device "
        f"(torch.{kind}.set_device(0)) before resolving."
    )


def _listing(probe: DeviceProbe, count: int) -> str:
    vis = visible_devices(probe=probe)
    parts = []
    for i in range(count):
        try:
            name = probe.properties(i).name
        except Exception:  # a device that cannot be read still gets its line
            name = "?"
        parts.append(f"cuda:{i} = physical {vis.physical_id(i)} ({name})")
    return "; ".join(parts)


def _resolve_cuda(index: int | None, probe: DeviceProbe) -> torch.device:
    problem = cuda_unavailable_reason(probe)
    want = "cuda" if index is None else f"cuda:{index}"
    if problem is not None:
        reason, fix = problem
        raise DeviceUnavailableError(f"cannot use {want!r}: {reason}. Fix: {fix}.")
    count = probe.device_count()
    if index is None:
        return _current("cuda", probe.current_device(), count, probe)
    if index >= count:
        vis = visible_devices(probe=probe)
        raise DeviceIndexError(
            f"cannot use {want!r}: {count} CUDA device(s) visible ({vis.describe()}): "
            f"{_listing(probe, count)}. Fix: use an index from 0 to {count - 1}, "
            f"or make more GPUs visible through {vis.variable}."
        )
    return torch.device("cuda", index)


def _resolve_other(kind: str, index: int | None, probe: DeviceProbe) -> torch.device:
    want = kind if index is None else f"{kind}:{index}"
    if not probe.backend_available(kind):
        fix = (
            "use a Mac with Apple silicon and macOS 12.3+ and an arm64 build of torch"
            if kind == "mps"
            else "install the Intel GPU driver and an XPU build of torch "
            "(https://pytorch.org/docs/stable/notes/get_start_xpu.html)"
        )
        raise DeviceUnavailableError(
            f"cannot use {want!r}: {_build_name(probe)} reports no usable {kind} device. "
            f"Fix: {fix}, or ask for 'auto' or 'cpu'."
        )
    count = probe.backend_device_count(kind)
    if index is None:
        return _current(kind, probe.backend_current_index(kind), count, probe)
    if index >= count:
        raise DeviceIndexError(
            f"cannot use {want!r}: {count} {kind} device(s) visible "
            f"({', '.join(f'{kind}:{i}' for i in range(count))}). "
            f"Fix: use an index from 0 to {count - 1}."
        )
    return torch.device(kind, index)
