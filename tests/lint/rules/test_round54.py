"""Round 54: an override runs where the method it overrides runs. A subclass's method that
overrides one its base class calls on ``self`` in its batch loop (DPO's
``FSDPTrainer.clip_gradient`` returning ``self.policy.clip_grad_norm_(m).item()``, which
``BasicTrainer.train`` calls after every optimizer step) is per batch as the base's is
(TPL201). And a factory in a method of a submodule that another module's ``forward`` calls on
the instance it holds (``self.GridGenerator = GridGenerator(...)`` in the TPS network's
``__init__``, ``self.GridGenerator.build_P_prime(c)`` in its ``forward``) is on the forward
path (TPL103)."""

from __future__ import annotations

import pytest

from .helpers import lines, project

TRAINERS = """\
import torch


class BasicTrainer:
    def __init__(self, policy, loader):
        self.policy = policy
        self.loader = loader

    def train(self):
        self.optimizer = torch.optim.Adam(self.policy.parameters())
        for batch in self.loader:
            batch = {k: v.to("cuda:0") for k, v in batch.items()}
            loss = self.policy(**batch).loss
            loss.backward()
            grad_norm = self.clip_gradient()
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.save()

    def clip_gradient(self):
        return torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0).item()

    def save(self):
        torch.save(self.policy.state_dict(), "policy.pt")


class FSDPTrainer(BasicTrainer):
    def clip_gradient(self):
        return self.policy.clip_grad_norm_(1.0).item()

    def save(self):
        total = sum(p.sum() for p in self.policy.parameters())
        print(total.item())
"""


def test_override_of_a_per_batch_method_is_per_batch() -> None:
    assert lines(TRAINERS, "TPL201", "trainers.py") == [21, 29]


def test_override_of_a_method_called_after_the_loop_is_not() -> None:
    # `save()` runs once, after the loop: its override's read is not per batch
    assert 33 not in lines(TRAINERS, "TPL201", "trainers.py")


def test_override_of_a_method_called_on_rare_steps_is_not() -> None:
    rare = TRAINERS.replace(
        "            grad_norm = self.clip_gradient()\n",
        "            if step % 100 == 0:\n                grad_norm = self.clip_gradient()\n",
    ).replace("for batch in self.loader:", "for step, batch in enumerate(self.loader):")
    assert lines(rare, "TPL201", "trainers.py") == []


def test_new_method_of_the_subclass_is_not_per_batch() -> None:
    # a method the base never defines nor calls is not made per batch by the base's loop
    renamed = TRAINERS.replace(
        "class FSDPTrainer(BasicTrainer):\n    def clip_gradient(self):",
        "class FSDPTrainer(BasicTrainer):\n    def clip_gradient_fsdp(self):",
    )
    assert lines(renamed, "TPL201", "trainers.py") == [21]


def test_override_in_another_module(tmp_path_factory: pytest.TempPathFactory) -> None:
    base, _, sub = TRAINERS.partition("class FSDPTrainer(BasicTrainer):\n")
    files = {
        "trainers.py": base,
        "fsdp_trainer.py": "from trainers import BasicTrainer\n\n\n"
        "class FSDPTrainer(BasicTrainer):\n" + sub,
    }
    found = project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert ("fsdp_trainer.py", 6) in found
    assert ("fsdp_trainer.py", 10) not in found


TPS = """\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TPS(nn.Module):
    def __init__(self, F):
        super().__init__()
        self.LocalizationNetwork = nn.Linear(F, F * 2)
        self.GridGenerator = GridGenerator(F)

    def forward(self, batch_I):
        batch_C_prime = self.LocalizationNetwork(batch_I)
        grid = self.GridGenerator.build_P_prime(batch_C_prime)
        return grid


class GridGenerator(nn.Module):
    def __init__(self, F):
        super().__init__()
        self.F = F

    def build_P_prime(self, batch_C_prime):
        batch_size = batch_C_prime.size(0)
        zeros = torch.zeros(batch_size, 3, 2).float().to(device)
        return torch.cat((batch_C_prime, zeros), dim=1)

    def describe(self, batch_C_prime):
        return torch.zeros(batch_C_prime.size(0), 3)
"""


def test_submodule_method_the_holder_runs_in_forward() -> None:
    assert lines(TPS, "TPL103", "transformation.py") == [26]


def test_submodule_method_the_holder_runs_only_in_init_is_not() -> None:
    init_only = TPS.replace(
        "        self.GridGenerator = GridGenerator(F)\n",
        "        self.GridGenerator = GridGenerator(F)\n"
        "        self.grid0 = self.GridGenerator.build_P_prime(torch.ones(1, F, 2))\n",
    ).replace(
        "        grid = self.GridGenerator.build_P_prime(batch_C_prime)\n",
        "        grid = self.grid0 + batch_C_prime\n",
    )
    assert lines(init_only, "TPL103", "transformation.py") == []


def test_submodule_method_of_an_instance_nobody_holds_is_not() -> None:
    loose = TPS.replace(
        "        self.GridGenerator = GridGenerator(F)\n",
        "        self.GridGenerator = nn.Identity()\n",
    )
    assert lines(loose, "TPL103", "transformation.py") == []
