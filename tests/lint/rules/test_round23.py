"""Corpus round 23: false positives found on robotics, policy-learning and multimodal code
(imitation-learning and diffusion-policy training, vision-language-action models, video
diffusion), each as the look-alike that must stay clean next to the pitfall that must still be
found."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines

# ---- TPL201: an epoch loop that validates, resets the gradients, then trains in a nested loop

EPOCHS = """\
import torch


def train(policy, optimizer, train_loader, val_loader, num_epochs):
    policy.cuda()
    for epoch in range(num_epochs):
        with torch.inference_mode():
            summaries = []
            for data in val_loader:
                summaries.append(policy(data.cuda()))
            summary = mean_dict(summaries)
        for k, v in summary.items():
            print(k, v.item())
        optimizer.zero_grad()
        for data in train_loader:
            loss = policy(data.cuda())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(loss.item())
"""


def test_a_read_once_per_epoch_after_the_validation_loop_is_left_alone() -> None:
    assert lines(EPOCHS, "TPL201") == []


def test_the_same_read_when_the_epoch_loop_steps_the_optimizer_is_reported() -> None:
    # gradients accumulated over the nested micro-batches, then one step per outer iteration
    source = EPOCHS.replace(
        "            optimizer.step()\n            optimizer.zero_grad()\n", ""
    ).replace(
        "        print(loss.item())\n", "        optimizer.step()\n        print(loss.item())\n"
    )
    assert lines(source, "TPL201") == [13, 19]


# ---- TPL401: a plain load in the `else` of `if not torch.cuda.is_available():`

RESTORE = """\
import os

import torch


def load_dict_from_checkpoint(ckpt_path):
    ckpt_path = os.path.expanduser(ckpt_path)
    if not torch.cuda.is_available():
        ckpt_dict = torch.load(ckpt_path, map_location=lambda storage, loc: storage)
    else:
        ckpt_dict = torch.load(ckpt_path)
    return ckpt_dict
"""


def test_a_load_in_the_else_of_a_negated_cuda_check_is_left_alone() -> None:
    assert lines(RESTORE, "TPL401", "file_utils.py") == []


def test_the_same_load_on_the_cpu_path_is_reported() -> None:
    source = RESTORE.replace("if not torch.cuda", "if torch.cuda")
    assert lines(source, "TPL401", "file_utils.py") == [11]


# ---- TPL102: throw-away tensors that probe whether a CUDA-only kernel runs, result discarded

PROBE = """\
import torch
import xformers.ops
from torch import nn


class Block(nn.Module):
    def set_use_memory_efficient_attention_xformers(self, enabled):
        if not torch.cuda.is_available():
            raise ValueError("xformers' memory efficient attention is only available for GPU")
        try:
            _ = xformers.ops.memory_efficient_attention(
                torch.randn((1, 2, 40), device="cuda"),
                torch.randn((1, 2, 40), device="cuda"),
            )
            q = torch.randn((1, 2, 40), device="cuda")
            _ = xformers.ops.memory_efficient_attention(q, q, q)
        except Exception as e:
            raise e
        self.use_xformers = enabled
"""


def test_probe_tensors_whose_result_is_discarded_are_left_alone() -> None:
    assert lines(PROBE, "TPL102", "attention.py") == []


def test_the_same_tensors_kept_by_the_module_are_reported() -> None:
    source = PROBE.replace("_ = xformers", "self.probe = xformers").replace(
        "(q, q, q)\n", "(q, q, q)\n            self.q = q\n"
    )
    assert lines(source, "TPL102", "attention.py") == [12, 13, 15]


def test_a_probe_result_written_into_the_module_is_reported() -> None:
    source = PROBE.replace(
        "_ = xformers.ops.memory_efficient_attention(\n",
        "_ = self.buf.copy_(\n",
    )
    assert lines(source, "TPL102", "attention.py") == [12, 13]


# ---- TPL201: host metrics packed per reduction kind, all-reduced across ranks and read back

SYNC_METRICS = """\
import torch
import torch.distributed as dist


def sync_metrics(metrics, device):
    buckets = {}
    for name, meter in metrics.items():
        buckets.setdefault(meter.reduction, []).append(name)
    ops = {"mean": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM}
    for reduction, names in buckets.items():
        tensor = torch.tensor([metrics[n].avg for n in names], device=device)
        dist.all_reduce(tensor, op=ops[reduction])
        for name, value in zip(names, tensor.tolist()):
            metrics[name].avg = value
"""


def test_host_values_all_reduced_per_group_and_read_back_are_left_alone() -> None:
    assert lines(SYNC_METRICS, "TPL201", "logging_utils.py") == []


def test_the_same_loop_computing_on_the_device_is_reported() -> None:
    source = SYNC_METRICS.replace(
        "        dist.all_reduce(tensor, op=ops[reduction])\n",
        "        dist.all_reduce(tensor, op=ops[reduction])\n        tensor = torch.log(tensor)\n",
    )
    assert lines(source, "TPL201", "logging_utils.py") == [14]


def test_the_same_upload_read_back_without_a_collective_is_reported() -> None:
    source = SYNC_METRICS.replace("        dist.all_reduce(tensor, op=ops[reduction])\n", "")
    assert lines(source, "TPL201", "logging_utils.py") == [12]


# ---- TPL301: a robot control loop paced by the clock, the action read back by a helper of a
# package in the src layout (`src/lerobot/policies/utils.py`, imported as `lerobot.policies.utils`)

CONTROL = """\
import time

import torch

from robotkit.utils import make_robot_action


def evaluate(policy, robot, names, fps):
    policy.to("cuda")
    while True:
        start = time.perf_counter()
        obs = torch.as_tensor(robot.get_observation()).to("cuda")
        action = policy(obs)
        values = make_robot_action(action, names)
        robot.send_action(values)
        dt = time.perf_counter() - start
        time.sleep(max(1 / fps - dt, 0.0))
"""

TO_ROBOT = """\
def make_robot_action(action, names):
    action = action.squeeze(0).to("cpu")
    return {name: float(action[i]) for i, name in enumerate(names)}
"""


def _control(tmp_path_factory: pytest.TempPathFactory, helper: str) -> Path:
    root = tmp_path_factory.mktemp("project")  # not a `test*` folder: linted as code
    package = root / "src" / "robotkit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(helper)
    (root / "examples").mkdir()
    (root / "examples" / "evaluate.py").write_text(CONTROL)
    return root / "examples" / "evaluate.py"


def test_a_src_layout_helper_that_reads_the_action_back_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = _control(tmp_path_factory, TO_ROBOT)
    assert lines(CONTROL, "TPL301", str(path)) == []


def test_a_src_layout_helper_that_keeps_the_action_on_the_device_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    helper = TO_ROBOT.replace('.to("cpu")', "").replace("float(action[i])", "action[i]")
    path = _control(tmp_path_factory, helper)
    assert lines(CONTROL, "TPL301", str(path)) == [11]


# ---- TPL403: a helper that unpickles the bytes of a message it is given, in a receive loop

RECEIVE = """\
import io

import torch


def bytes_to_transitions(buffer):
    bytes_buffer = io.BytesIO(buffer)
    bytes_buffer.seek(0)
    return torch.load(bytes_buffer, weights_only=True)


def learn(queue, replay_buffer):
    while True:
        transitions = bytes_to_transitions(buffer=queue.get())
        for transition in transitions:
            replay_buffer.add(transition)
"""


def test_a_helper_loading_the_message_bytes_it_is_given_is_left_alone() -> None:
    assert lines(RECEIVE, "TPL403", "learner.py") == []


def test_a_helper_loading_a_fixed_file_is_reported() -> None:
    source = RECEIVE.replace(
        "    bytes_buffer = io.BytesIO(buffer)\n", '    bytes_buffer = open("policy.pt", "rb")\n'
    )
    assert lines(source, "TPL403", "learner.py") == [14]
