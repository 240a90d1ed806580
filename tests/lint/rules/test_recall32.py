"""Recall round 32: pitfalls missed in classic training code, each next to the look-alike that
must stay clean: a per-batch metric helper that casts a name it binds to a torch reduction; a
batch moved by a transfer helper of the class (``self.to_var(x)``, moving its argument or
handing it back as given without CUDA); plus a precision fix: a read under ``if step in
chosen_steps:``, a branch taken on a few steps only."""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL201: `float()` of a name bound to a torch reduction, in a per-batch helper

DICE_METRIC = """\
import torch


def overlap_score(pred, mask, cut=0.5):
    pred = pred > cut
    shared = torch.sum(pred & (mask > 0))
    return float(shared) / pred.numel()


def fit(net, batches, opt, device):
    for img, mask in batches:
        img, mask = img.to(device), mask.to(device)
        out = net(img)
        loss = (out - mask).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        score = overlap_score(out, mask)
"""


def test_a_cast_of_a_name_bound_to_a_torch_reduction_in_a_per_batch_helper_is_reported() -> None:
    assert _lines(DICE_METRIC, "TPL201") == [7]


def test_a_cast_of_a_name_the_caller_hands_in_or_of_a_host_count_is_left_alone() -> None:
    # the name is a parameter rebound to its own cast: whatever the callers pass
    handed = DICE_METRIC.replace(
        "    shared = torch.sum(pred & (mask > 0))\n", "    shared = mask\n"
    )
    assert _lines(handed, "TPL201") == []
    # the name is bound to a Python count, not a tensor
    counted = DICE_METRIC.replace("torch.sum(pred & (mask > 0))", "len(pred)")
    assert _lines(counted, "TPL201") == []
    # the helper runs once, after training, not per batch
    once = DICE_METRIC.replace("        score = overlap_score(out, mask)\n", "") + (
        "    return overlap_score(out, mask)\n"
    )
    assert _lines(once, "TPL201") == []


# ---- TPL201: a batch moved by a transfer helper method of the trainer class

CRITIC_TRAINER = """\
import torch


class CriticTrainer:
    def __init__(self, critic, use_gpu):
        self.critic = critic
        self.use_gpu = use_gpu
        if use_gpu:
            self.critic.cuda(0)
        self.opt = torch.optim.RMSprop(self.critic.parameters(), lr=5e-5)

    def as_input(self, tensor):
        if self.use_gpu:
            return tensor.cuda(0)
        return tensor

    def run(self, stream, steps):
        for step in range(steps):
            real = self.as_input(next(stream))
            score = self.critic(real).mean()
            self.opt.zero_grad()
            score.backward()
            self.opt.step()
            print(f"step {step} critic {score}")
"""


def test_a_value_moved_by_a_transfer_helper_of_the_class_is_a_device_value() -> None:
    assert _lines(CRITIC_TRAINER, "TPL201") == [24]
    # the same helper as a module-level function of the file
    free = (
        CRITIC_TRAINER.replace(
            "    def as_input(self, tensor):\n        if self.use_gpu:\n"
            "            return tensor.cuda(0)\n        return tensor\n\n",
            "",
        ).replace("self.as_input(next(stream))", "as_input(next(stream))")
        + "\n\ndef as_input(tensor):\n    if torch.cuda.is_available():\n"
        "        return tensor.cuda(0)\n    return tensor\n"
    )
    assert _lines(free, "TPL201") == [19]


def test_a_helper_that_moves_to_the_cpu_or_computes_something_else_is_left_alone() -> None:
    # the helper brings its argument to the host: the printed score is a host value
    to_host = CRITIC_TRAINER.replace("tensor.cuda(0)", 'tensor.to("cpu")').replace(
        "            self.critic.cuda(0)\n", "            pass\n"
    )
    assert _lines(to_host, "TPL201") == []
    # the helper hands back something else than its argument (a fresh host tensor)
    fresh = CRITIC_TRAINER.replace("        return tensor\n", "        return torch.zeros(1)\n")
    fresh = fresh.replace("            self.critic.cuda(0)\n", "            pass\n")
    assert _lines(fresh, "TPL201") == []


# ---- precision: a read under `if step in chosen_steps:` runs on those few steps only

ASCENT = """\
import numpy as np
import torch


def climb(net, image, target, iters, device):
    image = image.to(device).requires_grad_(True)
    opt = torch.optim.SGD([image], lr=0.1)
    for it in range(iters):
        score = -net(image)[0, target]
        opt.zero_grad()
        score.backward()
        opt.step()
        if it in np.linspace(0, iters, 8, dtype=int):
            print("step", it, "score", score.item())
"""


def test_a_read_under_a_lookup_of_the_step_among_chosen_steps_is_left_alone() -> None:
    assert _lines(ASCENT, "TPL201") == []
    milestones = ASCENT.replace("np.linspace(0, iters, 8, dtype=int)", "(10, 100, 1000)")
    assert _lines(milestones, "TPL201") == []


def test_a_read_under_a_lookup_that_holds_on_every_step_is_reported() -> None:
    # `range(iters)` holds every step; so does a test of something else than the step
    every = ASCENT.replace("np.linspace(0, iters, 8, dtype=int)", "range(iters)")
    assert _lines(every, "TPL201") == [14]
    other = ASCENT.replace("if it in np.linspace(0, iters, 8, dtype=int):", "if target in (1, 2):")
    assert _lines(other, "TPL201") == [14]
