"""``--verify``: run the planned placement for real and compare with the plan.

The model is built with real weights and run once at the smallest planned batch (see
:mod:`torchplace.planner.runner`). The plan's devices are logical; :func:`real_devices` maps
them onto real ones: the devices named with ``--devices`` as they are; an assumed set onto this
machine's CUDA devices in order (contiguous stages share one when there are fewer, so with one
GPU every logical device is ``cuda:0``), or onto the CPU where there is none.

Compared with the plan, per logical edge (crossings counted at the stage boundaries, bytes and
count), and:

* on the CPU, each logical device's activation peak, from a tensor-allocation tracker;
* on real devices, each real device's peak from a :class:`MemoryProbe` (``CudaMemory``:
  ``max_memory_allocated`` above what the weights and a warm-up left, after a warm-up run)
  against the planned peak of the logical devices it holds, the inputs copied there included;
  and the bytes and count of every copy between two real devices, recorded by
  ``torchplace.guard``.

Memory past ``tolerance`` (relative), or any edge or copy that differs, fails the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torchplace.devices import resolve_device
from torchplace.errors import ConfigError, PlacementError
from torchplace.planner.budget import activation_peak
from torchplace.planner.crossings import Crossing, Flow, flow
from torchplace.planner.hardware import GiB, MiB
from torchplace.planner.runner import Run, place_weights
from torchplace.planner.strategies import HOST
from torchplace.planner.trace import label

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.planner.api import Plan
    from torchplace.sanitizer import GuardReport

__all__ = ["CudaMemory", "MemoryProbe", "Verdict", "check_tolerance", "real_devices", "verify"]

#: The largest model --verify builds in host memory.
MAX_VERIFY_BYTES = 4 * GiB


def check_tolerance(tolerance: float) -> None:
    """The largest relative memory error accepted: a fraction between 0 and 1 (not NaN)."""
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance} must be a fraction between 0 and 1")


class MemoryProbe(Protocol):
    """Peak memory of real devices: ``start`` before the forward, ``peak`` (bytes above what
    was allocated at ``start``) after it. ``name`` says what it reads."""

    name: str

    def start(self, device: torch.device) -> None: ...

    def peak(self, device: torch.device) -> int: ...


class CudaMemory:
    """``torch.cuda.max_memory_allocated`` above ``memory_allocated`` at the start."""

    name = "max_memory_allocated"

    def __init__(self) -> None:
        self.base: dict[torch.device, int] = {}

    def start(self, device: torch.device) -> None:
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.base[device] = torch.cuda.memory_allocated(device)

    def peak(self, device: torch.device) -> int:
        import torch

        torch.cuda.synchronize(device)  # the forward's kernels done: its allocations are final
        return int(torch.cuda.max_memory_allocated(device)) - self.base[device]


@dataclass
class Verdict:
    batch: int
    tolerance: float
    devices: dict[str, str]  # logical device -> real device
    measure: str  # what measured the memory: "tracker" or the probe's name
    memory: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    transfers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        rows = (*self.memory, *self.edges, *self.transfers)
        return all(row["ok"] for row in rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "tolerance": self.tolerance,
            "ok": self.ok,
            "devices": self.devices,
            "measure": self.measure,
            "memory": self.memory,
            "edges": self.edges,
            "transfers": self.transfers,
        }

    def where(self) -> str:
        """The mapping in words."""
        if set(self.devices.values()) == {HOST}:
            return "logical devices on the CPU"
        text = ", ".join(f"{k} -> {v}" for k, v in self.devices.items() if k != HOST)
        if len(set(self.devices.values())) < len(self.devices):
            text += "; logical devices that share a real one cross at the stage boundaries"
        return text

    def render(self) -> str:
        lines = [
            f"verify (batch {self.batch}, {self.where()}, memory by {self.measure}, tolerance "
            f"{self.tolerance:.0%}): {'PASS' if self.ok else 'FAIL'}"
        ]
        for m in self.memory:
            held = f" (logical {', '.join(m['logical'])})" if m["logical"] != [m["device"]] else ""
            lines.append(
                f"  {m['device']}{held}: activation peak planned {m['planned'] / MiB:,.3f} MiB, "
                f"measured {m['measured'] / MiB:,.3f} MiB ({m['error']:+.1%}) "
                f"{'ok' if m['ok'] else 'PAST TOLERANCE'}"
            )
        for e in self.edges:
            lines.append(
                f"  {e['src']} -> {e['dst']} at {e['consumer']}: planned {e['planned_bytes']:,} B "
                f"x{e['planned_count']}, measured {e['measured_bytes']:,} B x{e['measured_count']} "
                f"{'ok' if e['ok'] else 'DIFFERS'}"
            )
        for t in self.transfers:
            lines.append(
                f"  copies {t['src']} -> {t['dst']} (guard): planned {t['planned_bytes']:,} B "
                f"x{t['planned_count']}, recorded {t['measured_bytes']:,} B "
                f"x{t['measured_count']} {'ok' if t['ok'] else 'DIFFERS'}"
            )
        return "\n".join(lines) + "\n"


def real_devices(p: Plan, devices: Sequence[str] | None = None) -> dict[str, str]:
    """Logical device -> real device. ``devices``: the real ones to use (default: the plan's
    own when it was made for this machine's devices; else this machine's CUDA devices, or the
    CPU). With fewer real devices than logical ones, contiguous logical devices share one."""
    logical = [d.device for d in p.devices]
    if devices is None:
        devices = logical if not any(d.assumed for d in p.devices) else _available()
    if not devices:
        raise ConfigError("--verify needs a real device to run on; none was given")
    if set(logical) <= set(devices):
        out = {d: d for d in logical}
    else:
        k, n = len(logical), len(devices)
        out = {d: devices[i * n // k] for i, d in enumerate(logical)}
    return {**out, HOST: HOST}


def _available() -> list[str]:
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [HOST]


def _real_model(p: Plan) -> nn.Module:
    from torchplace.planner.budget import device_weights
    from torchplace.planner.inputs import load_plan_model

    total, _ = device_weights(p.units, dict.fromkeys(p.units.paths, HOST), HOST)  # ties once
    if total > MAX_VERIFY_BYTES:
        raise ConfigError(
            f"--verify builds {p.model.name!r} with real weights on the host ({total / GiB:.1f} "
            f"GiB), more than the {MAX_VERIFY_BYTES / GiB:.0f} GiB it allows; verify a smaller "
            "model, or fewer layers of the same shape"
        )
    kind, _, spec = p.model.source.partition(":")  # as load_plan_model named it
    declared = p.model.declared  # --input, which a factory without declarations needs again
    if kind == "exported":
        return load_plan_model("seed-mlp", exported=spec, inputs=declared, device="cpu").module
    module = load_plan_model(spec, inputs=declared, device="cpu").module
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        raise ConfigError(
            f"--verify runs {p.model.name!r} with real weights, but its factory builds them on "
            "'meta' (device='meta'); build them without a device (the planner builds under "
            "torch.device('meta') itself) to verify the plan"
        )
    return module


def verify(
    p: Plan,
    *,
    tolerance: float = 0.10,
    module: nn.Module | None = None,
    devices: Sequence[str] | None = None,
    probe: MemoryProbe | None = None,
) -> Verdict:
    """Run ``p``'s placement at its smallest batch on real devices and compare.

    ``devices``: the real devices (see :func:`real_devices`). ``probe``: what measures their
    memory; default :class:`CudaMemory` when a real device is not the CPU, else the logical
    devices' tracker. ``module``: the model with real weights (default: built from the plan's
    model); its units are moved onto the real devices.
    """
    check_tolerance(tolerance)
    real = {k: resolve_device(v) for k, v in real_devices(p, devices).items()}  # usable here
    # named as they resolve ("cuda" is "cuda:0"), as the measurements are keyed
    mapping = {k: str(d) for k, d in real.items()}
    if probe is None and any(d.type != "cpu" for d in real.values()):
        if any(d.type not in ("cpu", "cuda") for d in real.values()):
            raise ConfigError(
                f"--verify measures memory on cpu and cuda devices, not {sorted(mapping.values())}; "
                "pass a MemoryProbe for others"
            )
        probe = CudaMemory()
    model = module if module is not None else _real_model(p)
    place_weights(p, model, real)
    planned = flow(p.traces[p.batches[0]], p.placement, replica=p.placement.replica)
    if probe is None:  # the CPU: the logical devices' tracker
        run = _run(p, model, real)
        verdict = Verdict(p.batches[0], tolerance, mapping, "tracker")
        _compare_memory_logical(p, verdict, run)
    else:
        _run(p, model, real)  # warm-up: lazy state, kernels, library workspaces
        used = list(dict.fromkeys(d for k, d in real.items() if k != HOST and d.type != "cpu"))
        used = used or [real[k] for k in real if k != HOST][:1]
        for dev in used:
            probe.start(dev)
        run, report = _guarded_run(p, model, real)
        verdict = Verdict(p.batches[0], tolerance, mapping, probe.name)
        _compare_memory_real(planned, verdict, run, {str(d): probe.peak(d) for d in used})
        _compare_transfers(verdict, planned.crossings, report)
    _compare_edges(planned, verdict, run)
    return verdict


def _run(p: Plan, model: nn.Module, real: dict[str, torch.device]) -> Run:
    run = Run(p, model, real)
    try:
        run.run()
    except (RuntimeError, NotImplementedError) as exc:
        where = ", ".join(sorted({str(d) for d in real.values()}))
        raise PlacementError(f"--verify could not run the placement on {where}: {exc}") from exc
    except Exception as exc:  # the model's own forward, on real values (the plan had none)
        where = ", ".join(sorted({str(d) for d in real.values()}))
        raise PlacementError(
            f"--verify could not run the placement on {where}: the forward raised "
            f"{type(exc).__name__}: {exc} (on 'meta' the plan reads no values: a sequence past "
            "the model's position table, or ids past its vocabulary, are planned as given)"
        ) from exc
    return run


def _guarded_run(
    p: Plan, model: nn.Module, real: dict[str, torch.device]
) -> tuple[Run, GuardReport]:
    from torchplace.sanitizer import guard

    with guard(allow=["sync", "mixed_device", "pageable_non_blocking"], max_events=1 << 20) as g:
        run = _run(p, model, real)
    return run, g


def _row(planned: int, got: int, tolerance: float) -> dict[str, Any]:
    error = (planned - got) / got if got else (0.0 if planned == 0 else 1.0)
    return {"planned": planned, "measured": got, "error": error, "ok": abs(error) <= tolerance}


def _compare_memory_logical(p: Plan, verdict: Verdict, run: Run) -> None:
    for dev, budget in p.budgets.items():
        if run.only is not None and dev != run.only:
            continue
        got = run.rt.peak.get(dev, 0)
        planned = budget.activation[run.batch]
        row = {"device": dev, "logical": [dev], **_row(planned, got, verdict.tolerance)}
        verdict.memory.append(row)


def _compare_memory_real(planned: Flow, verdict: Verdict, run: Run, peaks: dict[str, int]) -> None:
    """Per real device: the planned peak of the logical devices it holds, together, and the
    inputs copied there (a real device's allocator sees both), against the probe's peak."""
    for dev, got in peaks.items():
        held = [k for k, v in verdict.devices.items() if v == dev and k != HOST]
        if run.only is not None:  # replicate: one replica ran
            held = [k for k in held if k == run.only]
        if not held:
            continue
        spans = [s for k in held for s in planned.spans.get(k, [])]
        want = activation_peak(spans) + sum(planned.inputs.get(k, 0) for k in held)
        verdict.memory.append(
            {"device": dev, "logical": held, **_row(want, got, verdict.tolerance)}
        )


def _compare_edges(planned: Flow, verdict: Verdict, run: Run) -> None:
    edges: dict[tuple[str, str, str], list[int]] = {}
    for c in planned.crossings:
        entry = edges.setdefault((c.src, c.dst, label(c.consumer)), [0, 0])
        entry[0] += c.total
        entry[1] += c.count
    verdict.edges.extend(
        {"src": k[0], "dst": k[1], "consumer": k[2], **row}
        for k, row in _matched(edges, run.measured)
    )


def _compare_transfers(
    verdict: Verdict, crossings: Sequence[Crossing], report: GuardReport
) -> None:
    """The plan's crossings between two real devices, against the copies the guard recorded."""
    to_real = verdict.devices
    planned: dict[tuple[str, str], list[int]] = {}
    for c in crossings:
        src, dst = to_real.get(c.src, c.src), to_real.get(c.dst, c.dst)
        if src != dst:
            entry = planned.setdefault((src, dst), [0, 0])
            entry[0] += c.total
            entry[1] += c.count
    recorded: dict[tuple[str, str], list[int]] = {}
    for event in report.transfers:
        entry = recorded.setdefault((str(event.src), str(event.dst)), [0, 0])
        entry[0] += event.nbytes
        entry[1] += 1
    verdict.transfers.extend(
        {"src": k[0], "dst": k[1], **row} for k, row in _matched(planned, recorded)
    )


def _matched(
    planned: dict[Any, list[int]], measured: dict[Any, list[int]]
) -> list[tuple[Any, dict[str, Any]]]:
    out = []
    for key in dict.fromkeys([*planned, *measured]):
        want, got = planned.get(key, [0, 0]), measured.get(key, [0, 0])
        out.append(
            (
                key,
                {
                    "planned_bytes": want[0],
                    "planned_count": want[1],
                    "measured_bytes": got[0],
                    "measured_count": got[1],
                    "ok": want == got,
                },
            )
        )
    return out
