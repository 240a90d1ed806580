"""--verify on real CUDA devices: memory from max_memory_allocated, copies from the guard."""

from __future__ import annotations

import json

import pytest

from torchplace.cli import main
from torchplace.planner.api import plan
from torchplace.planner.verify import verify

pytestmark = pytest.mark.cuda


def _gpus() -> list[str]:
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def test_a_pipeline_verifies_on_this_machines_gpus() -> None:
    p = plan("wide-mlp", batch_sizes=[8], assume="2xH200", strategy="pipeline")
    verdict = verify(p)
    assert verdict.ok, verdict.render()
    assert verdict.measure == "max_memory_allocated"
    assert set(verdict.devices.values()) <= {*_gpus(), "cpu"}
    assert all(m["device"].startswith("cuda:") for m in verdict.memory)
    # the batch goes to the first GPU and the output comes back, as the guard recorded
    copies = {(t["src"], t["dst"]): t for t in verdict.transfers}
    assert copies["cpu", "cuda:0"]["measured_bytes"] == 8 * 512 * 4
    assert all(t["ok"] for t in verdict.transfers)


def test_two_logical_devices_share_one_gpu() -> None:
    p = plan("wide-mlp", batch_sizes=[8], assume="2xH200", strategy="pipeline")
    verdict = verify(p, devices=["cuda:0"])
    assert verdict.ok, verdict.render()
    (row,) = verdict.memory
    assert (row["device"], row["logical"]) == ("cuda:0", ["cuda:0", "cuda:1"])
    # the stage boundary is no copy between real devices, but is counted where it is
    inner = next(e for e in verdict.edges if (e["src"], e["dst"]) == ("cuda:0", "cuda:1"))
    assert inner["measured_bytes"] == 8 * 2048 * 4
    assert {(t["src"], t["dst"]) for t in verdict.transfers} == {
        ("cpu", "cuda:0"),
        ("cuda:0", "cpu"),
    }
    assert "share a real one" in verdict.render()


def test_accelerate_hooks_verify_on_the_gpu() -> None:
    p = plan(
        "gpt2-like",
        batch_sizes=[2],
        seq=64,
        assume="2xH200",
        strategy="accelerate",
        max_memory=[300 << 20, 600 << 20],
    )
    verdict = verify(p)
    assert verdict.ok, verdict.render()


def test_the_command_verifies_on_cuda_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--model",
            "wide-mlp",
            "--batch",
            "8",
            "--strategy",
            "pipeline",
            "--verify",
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0, document["result"]["verify"]
    assert document["result"]["verify"]["measure"] == "max_memory_allocated"
