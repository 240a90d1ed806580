"""Core, prefetch and doctor as an ML engineer uses them first, round 3, reproduced without the
libraries.

Tried on real material and found to behave as designed (not repeated here): ``move`` and
``to_host`` on transformers' ``ModelOutput`` (BERT, GPT-2) and ``BatchEncoding``;
``torch.return_types`` results (``topk``, ``linalg.eigh``); ``DevicePrefetcher`` over
DataLoaders with dict, namedtuple (with defaults) and dataclass batches, strings and None in
batches, an ``IterableDataset`` with and without workers, ``drop_last`` with
``persistent_workers``, huggingface ``datasets`` (``with_format("torch")``, ``to_iterable_dataset``),
early ``break`` then further epochs, and a dataset raising mid-epoch (the error reaches the loop
unchanged, and the next pass runs); ``load_checkpoint`` on a Lightning ``Trainer`` checkpoint,
``save_pretrained`` directories (one file, sharded with an index, GPT-2's tied weights) and an
accelerate ``save_state``/``save_model`` directory (its ``optimizer.bin`` is refused as an
optimizer's state dict, its ``random_states_0.pkl`` as needing numpy globals).

Pinned here: transformers' ``DynamicCache`` (in every GPT-2 output with ``use_cache``) keeps its
tensors two levels down, ``cache.layers[i].keys``. ``move`` passed it back with them where
they were and ``check_same_device`` did not see them, since a plain object's tensors were
searched one attribute deep. ``audit_module`` still looks one attribute deep into the plain
objects a module holds: a Lightning module after ``Trainer.fit`` holds its trainer, and a deep
walk listed the optimizer's state and the dataset as the module's strays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from torchplace import (
    ConfigError,
    DevicePrefetcher,
    MixedDeviceError,
    audit_module,
    check_same_device,
    move,
)
from torchplace.doctor import collect
from torchplace.doctor.probes import cpu_limits
from torchplace.placement.containers import object_tensors


class Layer:
    """Like transformers' ``DynamicLayer``: keys and values, and a flag."""

    def __init__(self, owner: object) -> None:
        self.keys = torch.zeros(2, 3)
        self.values = torch.ones(2, 3)
        self.is_initialized = True
        self.owner = owner  # a back reference: the walk must end


class Cache:
    """Like transformers' ``DynamicCache``: no ``to`` method, tensors in a list of layers."""

    def __init__(self) -> None:
        self.layers = [Layer(self), Layer(self)]
        self.offloading = False


def output(logits: torch.Tensor) -> dict[str, Any]:
    """A causal LM's output as ``GPT2LMHeadModel`` returns it with ``use_cache``."""
    return {"logits": logits, "cache": Cache()}


def test_object_tensors_finds_tensors_inside_held_containers_and_objects() -> None:
    cache = Cache()
    found = object_tensors(cache, "cache")
    assert [path for path, _ in found] == [
        "cache.layers[0].keys",
        "cache.layers[0].values",
        "cache.layers[1].keys",
        "cache.layers[1].values",
    ]
    assert found[0][1] is cache.layers[0].keys


def test_object_tensors_skips_modules_and_classes_held_by_an_object() -> None:
    class Holder:
        def __init__(self) -> None:
            self.model = nn.Linear(2, 2)  # module.to() moves it: not this walk's
            self.kind = torch.Tensor
            self.scale = torch.ones(1)

    assert [path for path, _ in object_tensors(Holder(), "h")] == ["h.scale"]


def test_move_refuses_a_cache_whose_tensors_are_two_levels_down() -> None:
    with pytest.raises(ConfigError) as err:
        move(output(torch.ones(2)), "meta")
    text = str(err.value)
    assert 'value["cache"] is a Cache' in text
    assert "layers[0].keys" in text
    assert "layers[1].values" in text


def test_move_passes_a_cache_already_in_place() -> None:
    batch = output(torch.ones(2))
    moved = move(batch, "cpu")
    assert moved["cache"] is batch["cache"]


def test_check_same_device_sees_a_cache_left_on_another_device() -> None:
    with pytest.raises(MixedDeviceError) as err:
        check_same_device(output(torch.ones(2, device="meta")))
    assert 'args[0]["cache"].layers[1].values' in str(err.value)


def test_audit_does_not_follow_a_module_into_the_objects_it_works_with() -> None:
    """A Lightning module holds its trainer (``_trainer``), and through it the optimizer's
    state and the dataset: their tensors are not the module's, so not its strays."""

    class Trainer:
        def __init__(self) -> None:
            self.optimizer_state = {"exp_avg": torch.zeros(3)}
            self.data = Cache()

    class Task(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self._trainer = Trainer()
            self.rope = Layer(self)  # a helper object's own tensors are still found

    audit = audit_module(Task())
    assert [r.name for r in audit.strays] == ["rope.keys", "rope.values"]


def test_prefetcher_refuses_a_batch_with_a_cache_rather_than_leaving_it() -> None:
    batches = [output(torch.ones(2))]
    with pytest.raises(ConfigError, match=r"layers\[0\]\.keys"):
        list(DevicePrefetcher(batches, "meta"))


# -- the doctor's CPU quota: the process's own cgroup, not only the mount's top ----------------


def cgroups(tmp_path: Path, files: dict[str, str], own: str | None) -> tuple[str, str]:
    """A cgroup mount under ``tmp_path/fs`` holding ``files``, and a ``/proc/self/cgroup``
    saying ``own`` (None: absent, as in a sandbox without /proc)."""
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    if own is not None:
        (tmp_path / "cgroup").write_text(own)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


@pytest.mark.parametrize(
    ("files", "own", "quota"),
    [
        # systemd-run -p CPUQuota=200% on a cgroup v2 host: the limit is in the scope's cgroup
        (
            {"system.slice/run-u7.scope/cpu.max": "200000 100000\n"},
            "0::/system.slice/run-u7.scope\n",
            2.0,
        ),
        # a limit on the slice above is the process's limit too; the smallest wins
        (
            {"a.slice/cpu.max": "100000 100000\n", "a.slice/b.scope/cpu.max": "max 100000\n"},
            "0::/a.slice/b.scope\n",
            1.0,
        ),
        (
            {"a.slice/cpu.max": "400000 100000\n", "a.slice/b.scope/cpu.max": "150000 100000\n"},
            "0::/a.slice/b.scope\n",
            1.5,
        ),
        # in a cgroup namespace the process is at the top ("0::/"), where its limit is
        ({"cpu.max": "300000 100000\n"}, "0::/\n", 3.0),
        # a v1 container: /proc names the host's path, the mount shows the container at its top
        (
            {
                "cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
                "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            "12:cpu,cpuacct:/docker/0123abcd\n1:name=systemd:/docker/0123abcd\n",
            0.5,
        ),
        # v1 outside a namespace: the job's cgroup below the mount
        (
            {
                "cpu/slurm/job_9/cpu.cfs_quota_us": "200000\n",
                "cpu/slurm/job_9/cpu.cfs_period_us": "100000\n",
            },
            "4:cpu:/slurm/job_9\n",
            2.0,
        ),
        # no /proc/self/cgroup: the mount's top, as before
        ({"cpu.max": "250000 100000\n"}, None, 2.5),
        # a cgroup outside this namespace ("/../..") is not followed out of the mount
        ({"cpu.max": "max 100000\n"}, "0::/../../x\n", None),
        ({"cpu.max": "inf 100000\n"}, "0::/\n", None),
    ],
)
def test_the_cpu_quota_is_read_along_the_process_cgroup(
    tmp_path: Path, files: dict[str, str], own: str | None, quota: float | None
) -> None:
    top, proc = cgroups(tmp_path, files, own)
    assert cpu_limits(top, proc)[1] == quota


def test_the_doctor_reports_a_quota_set_below_the_mount_top(tmp_path: Path) -> None:
    top, proc = cgroups(
        tmp_path,
        {"system.slice/job.scope/cpu.max": "100000 100000\n"},
        "0::/system.slice/job.scope\n",
    )
    torch_threads = torch.get_num_threads()
    report = collect("cpu", smoke=False, toolkit=lambda: None, cpus=lambda: cpu_limits(top, proc))
    assert report["build"]["cpu_quota"] == 1.0
    threads = [c for c in report["checks"] if c["name"] == "cpu-threads"]
    if torch_threads > 1:  # more threads than the quota's one CPU: the check says so
        assert len(threads) == 1
        assert "a cgroup quota of 1 CPU(s)" in str(threads[0])


def test_a_tensor_key_is_named_by_its_type_and_shape_not_its_values() -> None:
    """An optimizer's ``state`` is keyed by parameters: a path holding their repr spread the
    table of a mismatch over many lines."""
    weight = nn.Parameter(torch.ones(2, 3))
    state = {weight: {"exp_avg": torch.zeros(2, 3, device="meta")}, "x": torch.ones(1)}
    with pytest.raises(MixedDeviceError) as err:
        check_same_device(state)
    assert 'args[0][<Parameter (2, 3)>]["exp_avg"]' in str(err.value)
    assert "tensor(" not in str(err.value)


def test_an_optimizer_is_checked_through_its_state_but_not_its_cpu_step_counters() -> None:
    """Adam keeps each parameter's ``step`` as a 0-dim cpu tensor beside state on the model's
    device, by design: no odd one out. A state left on the cpu while the model moved is."""
    model = nn.Linear(3, 2, device="meta")
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(4, 3, device="meta")).sum().backward()
    optimizer.step()
    steps = [s["step"] for s in optimizer.state.values()]
    assert steps
    assert all(s.device.type == "cpu" and s.dim() == 0 for s in steps)
    assert check_same_device(model, optimizer) == torch.device("meta")
    first = next(iter(optimizer.state.values()))
    first["exp_avg"] = torch.zeros(first["exp_avg"].shape)  # a state loaded onto the cpu
    with pytest.raises(MixedDeviceError, match=r'\["exp_avg"\]'):
        check_same_device(model, optimizer)
