"""The checks the doctor derives from the facts: build, driver, visibility, each device's arch
and memory, and the requested device. Each :class:`Check` says how it went and, when it failed,
the fix; the smoke tests that run on the device are in :mod:`torchplace.doctor.smoke`."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from torchplace.doctor.probes import Facts, build_kind, one_line

if TYPE_CHECKING:
    import torch

    from torchplace.devices import DeviceInfo, DeviceProbe

__all__ = [
    "Check",
    "Status",
    "arch_support",
    "build_check",
    "device_checks",
    "driver_check",
    "environment_checks",
    "init_check",
    "resolve_check",
    "visibility_checks",
]

Status = Literal["pass", "warn", "fail", "skip", "info"]

# compute capabilities of integrated GPUs (Jetson/Tegra): their cubins do not mix with dGPUs
_IGPU_CC = {53, 62, 72, 87}
_LOW_FREE_FRACTION = 0.10


@dataclass(frozen=True)
class Check:
    """One line of the verdict: what was checked, how it went, and the fix when it failed.

    ``applies_to`` scopes the check: None (always), a device type (``"cuda"``) or one device
    (``"cuda:1"``). Only failures that apply to the requested device make it unusable.
    """

    name: str
    status: Status
    detail: str
    fix: str | None = None
    applies_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def concerns(self, device: str | None) -> bool:
        if self.applies_to is None:
            return True
        if device is None:
            return False
        return self.applies_to in (device, device.split(":", 1)[0])


def arch_support(capability: tuple[int, int], arch_list: list[str]) -> tuple[Status, str]:
    """Whether a build with ``arch_list`` has kernels for a GPU of ``capability``.

    ``sm_XY`` cubins run natively on X.Y and, within the same major version, on later minors
    (integrated Tegra parts excepted); ``compute_XY`` PTX is JIT-compiled for any X.Y or newer,
    which works but makes the first run slow.
    """
    dev = capability[0] * 10 + capability[1]
    sm = f"sm_{dev}"
    cubins: list[int] = []
    ptx: list[int] = []
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", arch)
        if match is None:
            continue
        code, suffix = int(match.group(2)), match.group(3)
        if match.group(1) == "compute":
            ptx.append(code)
        elif suffix != "a" or code == dev:
            cubins.append(code)
    if dev in cubins:
        return "pass", f"{sm} is in the build"
    compatible = [
        c
        for c in cubins
        if c // 10 == dev // 10
        and c % 10 <= dev % 10
        and (c in _IGPU_CC) == (dev in _IGPU_CC)
        and (c not in _IGPU_CC or c == dev)
    ]
    if compatible:
        return "pass", f"{sm} runs the build's sm_{max(compatible)} kernels (same major version)"
    jit = [c for c in ptx if c <= dev]
    if jit:
        return "warn", f"{sm} has no cubin; kernels are JIT-compiled from compute_{max(jit)} PTX"
    return "fail", f"{sm} is not in the build's arch list ({' '.join(arch_list) or 'empty'})"


def init_check(facts: Facts) -> list[Check]:
    """The runtime's own failure when asked for its devices, each device that could not be
    read, and each other question the probe failed to answer."""
    checks = [
        Check(
            f"device {name}",
            "fail",
            f"reading {name} failed: {error}",
            "the GPU may be lost or stuck: check 'nvidia-smi' and the kernel log ('dmesg', "
            "look for Xid errors), then reset the GPU ('nvidia-smi -r') or reboot",
            name,
        )
        for name, error in facts.device_errors.items()
    ]
    checks += [
        Check(
            f"probe {question}",
            "warn",
            f"asking the device probe for {question} failed ({error}); the report shows it "
            "as unknown",
            "check the torch and driver install that answers it (or the probe, if you passed one)",
        )
        for question, error in facts.probe_errors
    ]
    if facts.init_error is None:
        return checks
    return [
        Check(
            "cuda-init",
            "fail",
            f"querying CUDA devices failed: {one_line(facts.init_error)}",
            "update the NVIDIA driver to one that supports this CUDA build, and check 'nvidia-smi'",
            "cuda",
        ),
        *checks,
    ]


def build_check(facts: Facts) -> Check:
    """A GPU build passes; a CPU-only build warns (it matters only when a GPU is wanted)."""
    version = facts.torch_version
    if facts.built:
        return Check(
            "build",
            "pass",
            f"torch {version}, {build_kind(facts.cuda_build, facts.hip_build)} build",
        )
    supported = facts.driver.cuda_driver_version
    return Check(
        "build",
        "warn",
        f"torch {version} is a CPU-only build (torch.version.cuda is None): "
        "it cannot use an NVIDIA or AMD GPU",
        "to use a GPU, install a CUDA (or ROCm) build of torch: the command for each is on "
        "https://pytorch.org/get-started/locally/, e.g. 'pip install torch --index-url "
        "https://download.pytorch.org/whl/cu128'"
        + (f"; this driver runs builds for CUDA {supported} and older" if supported else ""),
        "cuda",
    )


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts[:2]) if parts else None


def driver_check(facts: Facts) -> Check:
    """The driver as NVML sees it, against the CUDA version torch was built with."""
    driver = facts.driver
    if not driver.nvml_installed:
        known = facts.driver_version
        return Check(
            "driver",
            "info",
            "nvidia-ml-py is not installed, so NVML was not asked"
            + (f"; kernel module reports driver {known}" if known else ""),
            "pip install nvidia-ml-py (or torchplace[nvml]) for driver and physical GPU details",
            "cuda",
        )
    if driver.error:
        failed = facts.built and not facts.cuda_available and facts.hip_build is None
        return Check(
            "driver",
            "fail" if failed else "info",
            driver.error,
            "install the NVIDIA driver and check that 'nvidia-smi' works" if facts.built else None,
            "cuda",
        )
    return _driver_version_check(facts)


def _driver_version_check(facts: Facts) -> Check:
    driver, build = facts.driver, facts.cuda_build
    need, have = _version_tuple(build), _version_tuple(driver.cuda_driver_version)
    detail = (
        f"driver {driver.driver_version} supports CUDA up to {driver.cuda_driver_version}; "
        f"{driver.physical_gpu_count} physical GPU(s)"
    )
    update = f"update the NVIDIA driver to one that supports CUDA {build}"
    if not (need and have and have < need):
        return Check("driver", "pass", detail, None, "cuda")
    if have[0] < need[0] and not facts.cuda_available:
        return Check(
            "driver",
            "fail",
            f"{detail}, but torch was built with CUDA {build}",
            f"{update}, or install a torch build for an older CUDA",
            "cuda",
        )
    if have[0] < need[0]:
        # CUDA initialised all the same: a CUDA forward-compatibility package (cuda-compat, as
        # in many datacenter containers) supplies a newer user-mode driver than the kernel
        # driver NVML reports; the smoke tests say whether it really works
        return Check(
            "driver",
            "warn",
            f"{detail}; torch was built with CUDA {build} and CUDA initialised "
            "anyway (a forward-compatibility package?)",
            f"to run without a compatibility package, {update}",
            "cuda",
        )
    return Check(
        "driver",
        "warn",
        f"{detail}; torch was built with CUDA {build} (runs through minor "
        "version compatibility; PTX JIT may fail)",
        update,
        "cuda",
    )


def visibility_checks(facts: Facts) -> list[Check]:
    """What ``CUDA_VISIBLE_DEVICES`` hides or maps, and whether CUDA and nvidia-smi agree."""
    vis, checks = facts.visible, []
    if facts.built and vis.hides_all:
        checks.append(
            Check(
                "visible-devices",
                "fail",
                f"{vis.describe()} hides every GPU from this process: {vis.why_hidden()}",
                f"unset {vis.variable} or list the GPUs to use, e.g. {vis.variable}=0",
                "cuda",
            )
        )
    elif vis.value is not None and not facts.built:  # `CUDA_VISIBLE_DEVICES=-1` on a CPU wheel
        detail = f"{vis.describe()}: not read, this torch build has no CUDA or ROCm"
        checks.append(Check("visible-devices", "info", detail, None, "cuda"))
    elif vis.value is not None and _matches_none(facts):
        checks.append(_matches_none_check(facts))
    elif vis.value is not None:
        mapping = ", ".join(f"{d.device} = physical {d.physical_id}" for d in facts.inventory)
        detail = f"{vis.describe()}: {mapping or 'no device mapped'}"
        short = _cut_short(facts)
        if short is None:
            checks.append(Check("visible-devices", "info", detail, None, "cuda"))
        else:
            reason, fix = short
            mapped = mapping or "no device mapped"
            checks.append(Check("visible-devices", "warn", f"{reason} ({mapped})", fix, "cuda"))
    checks += _container_check(facts)
    physical = facts.driver.physical_gpu_count or len(facts.inventory)
    order = facts.env["CUDA_DEVICE_ORDER"]
    if facts.hip_build is None and order is not None and order not in _DEVICE_ORDERS:
        checks.append(_bad_order_check(facts, order))
    elif physical > 1 and order != "PCI_BUS_ID" and facts.hip_build is None:
        why = "by default" if order is None else f"as CUDA_DEVICE_ORDER={order!r} is not PCI_BUS_ID"
        checks.append(
            Check(
                "device-order",
                "warn",
                f"CUDA numbers GPUs fastest first {why}, nvidia-smi by PCI bus: "
                "indices may not match between them",
                "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi agree",
                "cuda",
            )
        )
    return checks


_DEVICE_ORDERS = ("PCI_BUS_ID", "FASTEST_FIRST")


def _bad_order_check(facts: Facts, order: str) -> Check:
    """A ``CUDA_DEVICE_ORDER`` the CUDA runtime does not take: recent runtimes (seen with CUDA 13)
    then fail to start ("invalid device ordinal") while torch still counts the GPUs."""
    refused = facts.built and not facts.cuda_available
    said = f"CUDA_DEVICE_ORDER={order!r} is neither PCI_BUS_ID nor FASTEST_FIRST (exactly so, in capitals)"
    if refused:
        detail = f"{said}: CUDA did not start with it (recent CUDA runtimes refuse it: 'invalid device ordinal')"
    else:
        detail = f"{said}: recent CUDA runtimes refuse to start with it ('invalid device ordinal')"
    return Check(
        "device-order",
        "fail" if refused else "warn",
        detail,
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID (so CUDA and nvidia-smi number GPUs alike), or unset it",
        "cuda",
    )


def _matches_none(facts: Facts) -> bool:
    """Whether the visibility variable lists GPUs, NVML sees GPUs, and CUDA reads none of them."""
    vis = facts.visible
    return bool(
        facts.built
        and facts.hip_build is None
        and vis.physical_ids
        and facts.device_count == 0
        and facts.init_error is None
        and (facts.driver.physical_gpu_count or 0) > 0
    )


def _matches_none_check(facts: Facts) -> Check:
    vis, ids = facts.visible, facts.visible.physical_ids or ()
    gpus = facts.driver.physical_gpu_count or 0
    detail = (
        f"{vis.describe()} names none of the {gpus} GPU(s) NVML sees, so CUDA sees none: "
        f"{ids[0]!r} is not one of them"
    )
    fix = (
        f"list in {vis.variable} GPUs this machine has: indices from 0 to {gpus - 1} "
        "(in CUDA's order), or the GPU-/MIG- UUIDs 'nvidia-smi -L' shows"
    )
    legacy = [i for i in ids if i.startswith("MIG-GPU-")]
    if legacy:
        detail += (
            f"; {legacy[0]!r} is the MIG-GPU-<uuid>/<gi>/<ci> form only drivers before R470 read"
        )
        fix = f"use the MIG-<uuid> of each MIG device that 'nvidia-smi -L' shows in {vis.variable}"
    return Check("visible-devices", "fail", detail, fix, "cuda")


#: an entry of a visibility list that names a GPU (an index or a UUID), read or not
_GPU_ENTRY = re.compile(r"\+?[0-9]|GPU-|MIG-")


def _cut_short(facts: Facts) -> tuple[str, str] | None:
    """Why CUDA reads fewer GPUs than the visibility variable lists, and the fix; None if not."""
    vis, count = facts.visible, facts.device_count
    ids = vis.physical_ids or ()
    rocm = vis.rocr is not None or vis.variable != "CUDA_VISIBLE_DEVICES"
    fix = (
        f"list in {vis.variable} only GPUs this machine has "
        f"({'amd-smi list' if rocm else 'nvidia-smi -L'!r} shows their indices and UUIDs), "
        "separated by commas, with no empty or negative entry"
    )
    if vis.ignored:
        reason = vis.why_stopped() or ""
    elif not facts.cuda_available or count >= len(ids):
        return None
    elif sum(i.startswith("MIG-") for i in ids) > 1:
        reason = f"CUDA enumerates one MIG device per process, so only {ids[0]!r} is used"
        fix = "run one process per MIG device, each with its own MIG UUID in " + vis.variable
    else:
        rest = ids[count + 1 :]
        reason = f"{ids[count]!r} names no GPU here, and CUDA reads nothing after it" + (
            f" ({', '.join(map(repr, rest))} never read)" if rest else ""
        )
    unread = vis.ignored if vis.stopped_at == "" else vis.ignored[1:]  # past the bad entry
    listed = len(ids) + sum(bool(_GPU_ENTRY.match(e)) for e in unread)
    return f"{vis.describe()} lists {listed} GPU(s) but CUDA sees {count}: {reason}", fix


def _container_check(facts: Facts) -> list[Check]:
    """``NVIDIA_VISIBLE_DEVICES`` set outside a container start, where nothing reads it."""
    nvidia = facts.env["NVIDIA_VISIBLE_DEVICES"]
    if not nvidia or facts.visible.value is not None or not facts.cuda_available:
        return []
    listed = [e for e in nvidia.split(",") if e.strip()]
    if nvidia.strip().lower() in ("all", "none", "void") or len(listed) == facts.device_count:
        return []
    return [
        Check(
            "nvidia-visible-devices",
            "warn",
            f"NVIDIA_VISIBLE_DEVICES={nvidia!r} lists {len(listed)} GPU(s) but CUDA sees "
            f"{facts.device_count}: the NVIDIA container runtime reads it when a container "
            "starts, and nothing reads it afterwards",
            "to choose the GPUs of this process, set CUDA_VISIBLE_DEVICES "
            "(indices or UUIDs, e.g. CUDA_VISIBLE_DEVICES=0)",
            "cuda",
        )
    ]


#: the caching allocator's options (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``) across
#: torch releases; a CUDA build refuses any other key when CUDA starts
_ALLOC_OPTIONS = (
    "backend",
    "expandable_segments",
    "garbage_collection_threshold",
    "graph_capture_record_stream_reuse",
    "large_segment_size_mb",
    "max_non_split_rounding_mb",
    "max_split_size_mb",
    "per_process_memory_fraction",
    "pinned_max_cached_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_use_background_threads",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "roundup_power2_divisions",
)
_ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _alloc_entries(value: str) -> list[str]:
    """The ``key:value`` entries of an allocator config, split at commas outside ``[...]``."""
    entries, depth, current = [], 0, ""
    for char in value:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            entries.append(current)
            current = ""
        else:
            current += char
    return [e.strip() for e in [*entries, current] if e.strip()]


def _alloc_problem(entry: str) -> str | None:
    """What torch refuses in one ``key:value`` entry, None when it is fine."""
    import difflib

    key, sep, value = (part.strip() for part in entry.partition(":"))
    if not sep:
        return f"{entry!r} is not key:value (torch separates key and value with ':')"
    if key not in _ALLOC_OPTIONS:
        near = difflib.get_close_matches(key, _ALLOC_OPTIONS, n=1)
        return f"{key!r} is not an allocator option" + (
            f" (did you mean {near[0]!r}?)" if near else ""
        )
    if key.startswith(("expandable", "release_lock", "graph_capture")) or key.startswith(
        "pinned_use"
    ):
        return None if value in ("True", "False") else f"{key} takes True or False, not {value!r}"
    if key.endswith("_mb") and not value.isdigit():
        return f"{key} takes a whole number of MiB, not {value!r}"
    if key == "max_split_size_mb" and int(value) < 20:
        return f"max_split_size_mb is {value} but must be 20 or more"
    if key == "garbage_collection_threshold":
        try:
            ok = 0.0 < float(value) < 1.0
        except ValueError:
            ok = False
        return (
            None
            if ok
            else f"garbage_collection_threshold takes a number between 0 and 1, not {value!r}"
        )
    if key == "backend" and value not in ("native", "cudaMallocAsync"):
        return f"backend takes native or cudaMallocAsync, not {value!r}"
    return None


def environment_checks(facts: Facts) -> list[Check]:
    """Settings that break or slow CUDA: an allocator config torch refuses when CUDA starts
    (the doctor's own checks with ``--no-smoke`` allocate nothing, so would not see it), and
    ``CUDA_LAUNCH_BLOCKING=1`` left on."""
    checks = []
    for name in _ALLOC_VARS:
        value = facts.env.get(name)
        problems = [p for p in map(_alloc_problem, _alloc_entries(value or "")) if p]
        if problems:
            checks.append(
                Check(
                    "allocator-config",
                    "warn",
                    f"{name}={value!r}: {'; '.join(problems)}; a CUDA build of torch refuses it "
                    "when CUDA starts (ValueError at the first allocation)",
                    f"correct {name} (e.g. {name}=expandable_segments:True; the options are on "
                    "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf) "
                    "or unset it",
                    "cuda",
                )
            )
    checks += _thread_checks(facts)
    blocking = facts.env.get("CUDA_LAUNCH_BLOCKING")
    if blocking is not None and blocking.strip() == "1":
        checks.append(
            Check(
                "launch-blocking",
                "warn",
                "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the kernel to finish, "
                "which is for debugging and makes GPU code much slower",
                "unset CUDA_LAUNCH_BLOCKING once you are done debugging",
                "cuda",
            )
        )
    return checks


def _positive_counts(value: str) -> bool:
    """Whether ``value`` is a thread count OpenMP takes: ``4``, or a nested list ``4,2``."""
    parts = [p.strip() for p in value.split(",")]
    return all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts)


def _thread_checks(facts: Facts) -> list[Check]:
    """``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` that OpenMP ignores (0, negative, not a number),
    and more torch threads than the CPUs this process may use (affinity, cgroup quota)."""
    import math

    checks = []
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = facts.env.get(name)
        if value is not None and not _positive_counts(value):
            checks.append(
                Check(
                    "cpu-threads",
                    "warn",
                    f"{name}={value!r} is not a positive whole number: OpenMP/MKL ignore it "
                    "(libgomp prints 'Invalid value') and use their own default",
                    f"set {name} to the number of threads to use (e.g. {name}=4), or unset it",
                )
            )
    threads = facts.flags.get("cpu_threads")
    limits = []
    if facts.cpu_affinity:
        limits.append((facts.cpu_affinity, f"{facts.cpu_affinity} CPU(s) in its affinity mask"))
    if facts.cpu_quota:
        limits.append(
            (max(1, math.ceil(facts.cpu_quota)), f"a cgroup quota of {facts.cpu_quota:g} CPU(s)")
        )
    if isinstance(threads, int) and limits:
        cpus, why = min(limits)
        if threads > cpus:
            checks.append(
                Check(
                    "cpu-threads",
                    "warn",
                    f"torch runs {threads} CPU threads but this process may use {cpus} CPU(s) "
                    f"({why}): oversubscribed threads make CPU work much slower",
                    f"export OMP_NUM_THREADS={cpus} (or call torch.set_num_threads({cpus}))",
                    "cpu",
                )
            )
    return checks


def device_checks(facts: Facts, info: DeviceInfo) -> tuple[dict[str, Any], list[Check]]:
    """One visible device's report entry, and its arch and free-memory checks."""
    entry, checks = info.to_dict(), []
    if info.capability is not None and facts.cuda_build is not None and facts.arch_list:
        status, detail = arch_support(info.capability, facts.arch_list)
        entry["arch_support"] = status
        major, minor = info.capability
        fix = (
            None
            if status == "pass"
            else f"install a torch build whose arch list includes {info.sm} "
            "(see https://pytorch.org/get-started/locally/), or build from source with "
            f"TORCH_CUDA_ARCH_LIST={major}.{minor}"
        )
        checks.append(
            Check(f"arch {info.device}", status, f"{info.name}: {detail}", fix, info.device)
        )
    if info.free_memory is not None and info.total_memory:
        fraction = info.free_memory / info.total_memory
        entry["free_fraction"] = round(fraction, 4)
        if fraction < _LOW_FREE_FRACTION:
            checks.append(
                Check(
                    f"memory {info.device}",
                    "warn",
                    f"only {gib(info.free_memory)} of {gib(info.total_memory)} free: "
                    "another process is using this GPU",
                    "see 'nvidia-smi' for the processes; pick another GPU or stop them",
                    info.device,
                )
            )
    return entry, checks


def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal, ``?`` when unknown."""
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def _split_fix(message: str) -> tuple[str, str | None]:
    message = re.sub(r"^cannot use '[^']*': ", "", message)
    reason, sep, fix = message.partition(" Fix: ")
    return (reason.rstrip("."), fix.rstrip(".")) if sep else (message, None)


def resolve_check(
    spec: str | None, probe: DeviceProbe, *, accelerator: str | None = None
) -> tuple[torch.device | None, Check]:
    """Resolve the requested device: the device (None when it cannot be used) and its check.

    ``accelerator`` is the type ``torch.accelerator`` reports, named when "auto" falls back to
    the CPU past an accelerator torchplace does not resolve. A spec that does not parse raises
    :class:`~torchplace.errors.ConfigError` (a usage error); anything else the probe or the
    runtime raises is a failed check.
    """
    from torchplace.devices import resolve_device
    from torchplace.devices.spec import shown
    from torchplace.errors import ConfigError, DeviceError

    try:
        chosen = resolve_device(spec, probe=probe)
    except ConfigError:
        raise
    except DeviceError as exc:
        reason, fix = _split_fix(str(exc))
        return None, Check("resolve", "fail", reason, fix, None)
    except Exception as exc:  # the runtime (or the probe) failed: driver too old, device lost
        return None, Check(
            "resolve",
            "fail",
            f"asking the runtime about {shown(spec)} failed: {one_line(exc)}",
            "check 'nvidia-smi' and that the driver supports this torch build",
            None,
        )
    note = _auto_note(spec, chosen, probe, accelerator)
    return chosen, Check("resolve", "pass", f"{shown(spec)} -> {chosen}{note}", None, None)


def _auto_note(
    spec: str | None, chosen: torch.device, probe: DeviceProbe, accelerator: str | None
) -> str:
    """Where "auto" took its device from: the environment, or why no accelerator."""
    from torchplace.devices import DEVICE_ENV_VAR, cuda_unavailable_reason
    from torchplace.devices.spec import OTHER_ACCELERATORS, parse_spec, shown

    if parse_spec(spec)[0] != "auto":
        return ""
    try:
        from_env = probe.env(DEVICE_ENV_VAR)
        if from_env and from_env.strip() and from_env.strip().lower() != "auto":
            return f" (from ${DEVICE_ENV_VAR}={shown(from_env)})"
        if chosen.type != "cpu":
            return ""
        if accelerator not in (None, "cpu", "cuda", *OTHER_ACCELERATORS):
            return (
                f" (torch's accelerator here is {accelerator!r}, which resolve_device does not "
                f"resolve: use torch.device({accelerator!r}) in your code directly)"
            )
        problem = cuda_unavailable_reason(probe)
    except Exception:  # the resolve check above already passed; a note is not worth failing
        return ""
    return f" (no accelerator: {problem[0]})" if problem else " (no accelerator)"
