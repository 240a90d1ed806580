"""--verify: the planned placement run for real agrees with the plan; the CUDA path's logic on
the CPU (one real device, a scripted memory probe); the GPU itself in test_verify_cuda.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.planner.conftest import toy_plan
from tests.planner.toy import make_toy
from torchplace.errors import ConfigError, DeviceError
from torchplace.planner.api import Plan, plan
from torchplace.planner.budget import activation_peak
from torchplace.planner.verify import Verdict, _compare_transfers, real_devices, verify

if TYPE_CHECKING:
    import torch

#: the plan's devices as logical devices on the CPU, measured by the tracker (also on a GPU machine)
CPU = ["cpu"]


def test_a_pipeline_of_the_toy_model_verifies_exactly() -> None:
    p = _toy_pipeline()
    verdict = verify(p, module=make_toy(), devices=CPU)
    assert verdict.ok
    assert all(m["error"] == 0 for m in verdict.memory)
    assert [(e["src"], e["dst"], e["consumer"]) for e in verdict.edges] == [
        ("cpu", "cuda:0", "inp"),
        ("cuda:0", "cuda:1", "blocks.1"),
        ("cuda:1", "cpu", "(host)"),
    ]
    inner = next(e for e in verdict.edges if e["src"] == "cuda:0")
    assert inner["measured_count"] == 2
    assert inner["measured_bytes"] == 2 * 2 * 8 * 4


def test_accelerate_hooks_verify_with_their_re_copies() -> None:
    p = plan(
        "gpt2-like",
        batch_sizes=[1],
        seq=16,
        assume="2xH200",
        strategy="accelerate",
        max_memory=[300 << 20, 600 << 20],
    )
    verdict = verify(p, devices=CPU)
    assert verdict.ok, verdict.render()
    mask = [e for e in verdict.edges if e["src"] == "cuda:0" and e["dst"] == "cuda:1"]
    assert (
        sum(e["measured_count"] for e in mask) == 1 + 8
    )  # the hidden state once, the mask per block


def test_a_wrong_plan_fails_past_the_tolerance() -> None:
    p = plan("wide-mlp", batch_sizes=[2], strategy="pipeline")
    dev = next(iter(p.budgets))
    budget = p.budgets[dev]
    p.budgets[dev] = dataclasses.replace(budget, activation={2: budget.activation[2] * 2})
    verdict = verify(p, tolerance=0.1, devices=CPU)
    assert not verdict.ok
    assert "PAST TOLERANCE" in verdict.render()


def test_too_big_to_verify_on_the_host_is_refused() -> None:
    p = plan("llama-7b-like", batch_sizes=[1], seq=8, assume="2xH200", strategy="pipeline")
    with pytest.raises(ConfigError, match="verify a smaller model"):
        verify(p)


def test_an_exported_program_is_planned_by_its_weights_and_verifies(tmp_path: Path) -> None:
    import torch

    from torchplace.models import build_model

    model = build_model("wide-mlp")
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 512),), dynamic_shapes=({0: batch},))
    path = tmp_path / "wide.pt2"
    torch.export.save(program, path)
    p = plan("seed-mlp", exported=path, batch_sizes=[2], strategy="pipeline")
    # a graph module reads its weights without calling its submodules: still one crossing
    inner = [c for c in p.flow.crossings if c.kind == "d2d"]
    assert [(c.consumer, c.nbytes) for c in inner] == [("2", 2 * 2048 * 4)]
    assert verify(p, devices=CPU).ok


def test_a_model_placed_whole_as_one_root_unit_verifies_exactly() -> None:
    # accelerate puts wide-mlp whole on cuda:1 (cuda:0 holds 1 MiB): the one unit is the root
    # module, path "", which once read as the model's own code between units
    p = plan(
        "wide-mlp",
        batch_sizes=[1],
        assume="2xH200",
        strategy="accelerate",
        max_memory=[1 << 20, 1 << 30],
    )
    assert p.units.paths == [""]
    # the inputs go to accelerate's main device, the map's one device: none via cuda:0
    assert not [c for c in p.flow.crossings if c.kind == "d2d"]
    verdict = verify(p, devices=CPU)
    assert verdict.ok, verdict.render()
    assert [m["error"] for m in verdict.memory] == [0.0]
    assert {(e["src"], e["dst"], e["consumer"]) for e in verdict.edges} == {
        ("cpu", "cuda:1", "(model call)"),
        ("cuda:1", "cpu", "(host)"),
    }


class ScriptedMemory:
    """A memory probe that reports a given peak for each real device, and what it was asked."""

    name = "scripted"

    def __init__(self, peaks: dict[str, int]) -> None:
        self.peaks, self.started = peaks, []

    def start(self, device: torch.device) -> None:
        self.started.append(str(device))

    def peak(self, device: torch.device) -> int:
        return self.peaks[str(device)]


def _toy_pipeline() -> Plan:
    return toy_plan("make_toy", strategy="pipeline")


def test_logical_devices_map_onto_fewer_real_ones_in_contiguous_runs() -> None:
    p = plan("wide-mlp", assume="4x80GiB", strategy="pipeline")
    assert real_devices(p, ["cuda:0"]) == {
        "cuda:0": "cuda:0",
        "cuda:1": "cuda:0",
        "cuda:2": "cuda:0",
        "cuda:3": "cuda:0",
        "cpu": "cpu",
    }
    two = real_devices(p, ["cuda:0", "cuda:1"])
    assert [two[f"cuda:{i}"] for i in range(4)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert real_devices(p, [f"cuda:{i}" for i in range(8)])["cuda:3"] == "cuda:3"


def test_a_plan_for_this_machines_devices_runs_on_them_by_name() -> None:
    from tests.planner.test_hardware import H200, L4, _probe

    p = plan("seed-mlp", devices="all", probe=_probe(H200, L4))
    assert real_devices(p) == {"cuda:0": "cuda:0", "cuda:1": "cuda:1", "cpu": "cpu"}


def test_two_logical_devices_on_one_real_one_are_measured_together() -> None:
    # the CUDA path's logic on the CPU: both stages on one real device, memory from a probe
    p = _toy_pipeline()
    flow = p.flow
    inputs = 2 * 4 * 4  # x, copied to cuda:0
    together = activation_peak(flow.spans["cuda:0"] + flow.spans["cuda:1"]) + inputs
    assert together > max(b.activation[2] for b in p.budgets.values()) + inputs
    probe = ScriptedMemory({"cpu": together})
    verdict = verify(p, module=make_toy(), devices=["cpu"], probe=probe)
    assert verdict.ok, verdict.render()
    assert probe.started == ["cpu"]  # once, after the warm-up run
    (row,) = verdict.memory
    assert (row["device"], row["logical"], row["planned"]) == (
        "cpu",
        ["cuda:0", "cuda:1"],
        together,
    )
    assert verdict.devices == {"cuda:0": "cpu", "cuda:1": "cpu", "cpu": "cpu"}
    # one real device: no copy between real devices, the stage boundary still counted
    assert verdict.transfers == []
    inner = next(e for e in verdict.edges if e["src"] == "cuda:0")
    assert (inner["dst"], inner["measured_count"], inner["ok"]) == ("cuda:1", 2, True)
    text = verdict.render()
    assert "logical devices on the CPU, memory by scripted" in text
    assert "cpu (logical cuda:0, cuda:1): activation peak planned" in text
    shared = Verdict(2, 0.1, {"cuda:0": "cuda:0", "cuda:1": "cuda:0", "cpu": "cpu"}, "probe")
    assert "cuda:0 -> cuda:0, cuda:1 -> cuda:0; logical devices that share" in (shared.render())


def test_a_real_device_named_otherwise_than_it_resolves_keeps_its_memory_row() -> None:
    """``cpu:0`` resolves to ``cpu`` (as ``cuda`` to ``cuda:0``): the verdict names the real
    device as the probe's measurements do, so its memory row is compared, not dropped."""
    p = _toy_pipeline()
    probe = ScriptedMemory({"cpu": 1 << 20})
    verdict = verify(p, module=make_toy(), devices=["cpu:0"], probe=probe)
    assert verdict.devices == {"cuda:0": "cpu", "cuda:1": "cpu", "cpu": "cpu"}
    (row,) = verdict.memory
    assert row["device"] == "cpu"


def test_a_real_device_past_the_tolerance_fails_the_verdict() -> None:
    p = _toy_pipeline()
    planned = verify(p, module=make_toy(), devices=["cpu"], probe=ScriptedMemory({"cpu": 1}))
    want = planned.memory[0]["planned"]
    assert not planned.ok
    ok = verify(
        p, module=make_toy(), devices=["cpu"], probe=ScriptedMemory({"cpu": int(want * 1.05)})
    )
    assert ok.ok
    bad = verify(p, module=make_toy(), devices=["cpu"], probe=ScriptedMemory({"cpu": want * 2}))
    assert not bad.ok
    assert "PAST TOLERANCE" in bad.render()


def test_copies_between_real_devices_are_compared_with_what_the_guard_recorded() -> None:
    from torchplace.sanitizer import GuardReport
    from torchplace.sanitizer.events import Event, Site

    p = _toy_pipeline()
    site = Site("serve.py", 1, "forward")
    report = GuardReport()
    for src, dst, nbytes in [
        ("cpu", "cuda:0", 32),
        ("cuda:0", "cuda:1", 64),
        ("cuda:0", "cuda:1", 64),
    ]:
        report.add(Event("h2d" if src == "cpu" else "d2d", site, "aten._to_copy", nbytes, src, dst))
    mapping = {"cuda:0": "cuda:0", "cuda:1": "cuda:1", "cpu": "cpu"}
    verdict = Verdict(2, 0.1, mapping, "scripted")
    _compare_transfers(verdict, p.flow.crossings, report)
    rows = {(t["src"], t["dst"]): t for t in verdict.transfers}
    assert rows["cpu", "cuda:0"]["ok"]
    assert rows["cuda:0", "cuda:1"]["ok"]
    assert not rows["cuda:1", "cpu"]["ok"]  # the output's copy to the host was not recorded
    assert rows["cuda:1", "cpu"]["planned_bytes"] == 2 * 2 * 4
    # on one GPU the stage boundary is no copy between real devices
    shared = Verdict(2, 0.1, {"cuda:0": "cuda:0", "cuda:1": "cuda:0", "cpu": "cpu"}, "scripted")
    _compare_transfers(shared, p.flow.crossings, report)
    assert [(t["src"], t["dst"], t["planned_count"]) for t in shared.transfers][:2] == [
        ("cpu", "cuda:0", 1),
        ("cuda:0", "cpu", 1),
    ]


def test_a_device_verify_cannot_measure_is_refused() -> None:
    p = _toy_pipeline()
    with pytest.raises(ConfigError, match="MemoryProbe"):
        verify(p, module=make_toy(), devices=["meta"])


def test_a_gpu_this_machine_lacks_is_refused() -> None:
    import torch

    p = _toy_pipeline()
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(DeviceError, match=f"cannot use '{missing}'"):
        verify(p, module=make_toy(), devices=[missing])


def test_a_replicated_plan_is_measured_on_its_one_running_replica() -> None:
    p = plan("seed-mlp", batch_sizes=[4], assume="2xH200", strategy="replicate")
    planned = p.budgets["cuda:0"].activation[4] + p.budgets["cuda:0"].inputs[4]
    verdict = verify(p, devices=["cpu"], probe=ScriptedMemory({"cpu": planned}))
    assert [(m["device"], m["logical"], m["planned"]) for m in verdict.memory] == [
        ("cpu", ["cuda:0"], planned)
    ]
    assert verdict.ok, verdict.render()


def test_code_between_units_reading_two_stages_verifies() -> None:
    """The model's own code adds two units' outputs made on two devices: the plan copies one
    to the other, and the run does the same (a U-Net's skip, a BERT's mask)."""
    p = toy_plan("make_branches", strategy="pipeline")
    glue = [c for c in p.flow.crossings if c.consumer == "(model code)"]
    assert glue, "the plan has the model code's copies"
    verdict = verify(p, devices=CPU)
    assert verdict.ok, verdict.render()
    assert any(e["consumer"] == "(model code)" and e["measured_count"] for e in verdict.edges)


def test_weights_read_on_another_device_are_copied_and_counted(tmp_path: Path) -> None:
    """A top-level parameter read by the model's code and handed to a block on another
    device: the run copies it as the plan does, and the edges agree."""
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"pos": 0, "scale": 1, "a": 0, "b": 1}))
    p = toy_plan("make_shared_position", map_file=path)
    verdict = verify(p, devices=CPU)
    assert verdict.ok, verdict.render()
    assert {(e["src"], e["consumer"]) for e in verdict.edges} >= {
        ("cuda:1", "(model code)"),
        ("cuda:0", "b"),
    }


@pytest.mark.parametrize("factory", ["make_encoder_stack", "make_attention"])
def test_fused_attention_verifies_exactly_on_the_cpu(factory: str) -> None:
    """Encoder layers and multi-head attention on their fast paths: the tracker cannot see
    inside their fused operators, so the run takes them as their parts, as the plan does."""
    p = toy_plan(factory, strategy="pipeline")
    verdict = verify(p, devices=CPU)
    assert verdict.ok, verdict.render()
    assert all(m["error"] == 0 for m in verdict.memory)
