"""Recall round 27: pitfalls missed on recommendation, super-resolution, speech separation,
medical-imaging engine, continual-learning and video-recognition training code, each next to
the look-alike that must stay clean: a function that is one whole training step by its own body
(``.backward()`` and an optimizer step) and reads its loss back, and a read on a later line of
a multi-line assignment that rebinds the name it reads."""

from __future__ import annotations

from torchplace.lint import lint_source

from .helpers import lines

# ---- TPL201: a training step by its own body, whoever calls it

STEP = """\
import torch


class PairLoss:
    def __init__(self, model, lr, device):
        self.model = model
        self.device = device
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)

    def step(self, users, items):
        loss = self.model.pair_loss(users, items)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.cpu().item()
"""


def test_the_loss_read_of_a_step_function_is_reported() -> None:
    assert lines(STEP, "TPL201") == [15]


def test_a_function_that_only_backpropagates_is_left_alone() -> None:
    # gradients for one input (an attribution, a saliency map), no optimizer step
    source = STEP.replace("        self.opt.step()\n", "")
    assert lines(source, "TPL201") == []


def test_a_step_read_under_a_periodic_branch_is_left_alone() -> None:
    source = STEP.replace(
        "    def step(self, users, items):",
        "    def step(self, users, items, it):",
    ).replace(
        "        return loss.cpu().item()",
        "        if it % 100 == 0:\n            print(loss.cpu().item())",
    )
    assert lines(source, "TPL201") == []


def test_a_whole_fit_with_its_own_loop_is_not_one_step() -> None:
    source = """\
import torch


def fit(model, opt, data, device, epochs):
    for epoch in range(epochs):
        loss = model(data.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()
"""
    assert lines(source, "TPL201") == []


GAN_STEP = """\
import torch


class GanEngine:
    def __init__(self, device):
        self.device = device

    def iteration(self, engine, batch):
        real = batch.to(self.device)
        fake = engine.generator(engine.noise())
        d_total = torch.zeros(1)
        for _ in range(engine.d_steps):
            engine.d_opt.zero_grad()
            d_loss = engine.d_loss(fake, real)
            d_loss.backward()
            engine.d_opt.step()
            d_total += d_loss.detach().cpu()
        engine.g_opt.zero_grad()
        g_loss = engine.g_loss(engine.generator(engine.noise()))
        g_loss.backward()
        engine.g_opt.step()
        return {"g": g_loss.item(), "d": d_total.item()}
"""


def test_a_step_with_inner_discriminator_steps_reads_its_loss_per_batch() -> None:
    # the host accumulator `d_total` (a CPU factory) is read for free; `g_loss` is not
    found = {(f.line, f.col) for f in lint_source(GAN_STEP, "train.py", select={"TPL201"})}
    assert found == {(17, 24), (22, 22)}


def test_an_epoch_function_over_a_loader_is_not_one_step() -> None:
    source = """\
import torch


def train_epoch(model, opt, train_loader, device):
    for x in train_loader:
        pass
    loss = model(x.to(device))
    loss.backward()
    opt.step()
    return loss.item()
"""
    assert lines(source, "TPL201") == []


HANDED = """\
import torch


class Learner:
    def __init__(self, net, opt, device):
        self.net = net.to(device)
        self.opt = opt

    def learn(self, mem, batch):
        lengths = batch["lengths"]
        sizes = lengths.tolist()
        loss = self.net(batch["x"], sizes)
        self.opt.zero_grad()
        loss.mean().backward()
        self.opt.step()
        mem.update_priorities(batch["idx"], loss.detach().cpu().numpy())
        return loss.mean().item()
"""


def test_what_a_step_is_handed_or_hands_to_a_host_structure_is_left_alone() -> None:
    # `lengths` is the caller's data; the per-sample losses go to a replay's host sum tree
    assert lines(HANDED, "TPL201") == [17]


def test_a_step_in_a_file_that_never_names_a_device_is_left_alone() -> None:
    source = """\
import torch


def finish_episode(policy, optimizer, returns):
    losses = policy.losses(returns)
    optimizer.zero_grad()
    losses.sum().backward()
    optimizer.step()
    return losses.sum().item()
"""
    assert lines(source, "TPL201") == []


def test_a_helper_the_step_calls_runs_per_batch_too() -> None:
    source = """\
import torch


class Replay:
    def __init__(self, eps, device):
        self.eps = eps
        self.device = device

    def before_backward(self, model, optimizer, x):
        x = x.to(self.device)
        loss = model(x)
        loss.backward()
        optimizer.step()
        return self.perturb(x, x.grad)

    def perturb(self, x, grad):
        out = x
        for _ in range(5):
            out = torch.clamp(out + 0.01 * torch.sign(grad), 0, 1)
            if torch.norm(out - x, p=float("inf")) > self.eps:
                break
        return out
"""
    assert lines(source, "TPL201") == [20]


# ---- TPL201: a read on a later line of a multi-line assignment that rebinds its name

TUPLE = """\
import torch


def train_epoch(loader, model, optimizer, device):
    for x, y in loader:
        x = x.to(device)
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        loss, norm = (
            loss.item(),
            x.norm().item(),
        )
        print(loss, norm)
"""


def test_a_read_inside_a_multi_line_rebinding_sees_the_old_value() -> None:
    assert lines(TUPLE, "TPL201") == [11, 12]


def test_the_name_after_the_rebinding_holds_the_host_value() -> None:
    # `print(loss, norm)` below reads the Python numbers the statement bound
    source = TUPLE.replace("        print(loss, norm)\n", "        print(f'{loss:.3f}')\n")
    assert 14 not in lines(source, "TPL201")
