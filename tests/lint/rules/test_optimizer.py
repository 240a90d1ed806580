"""TPL801 (rules/optimizer.py): moving a model moves the submodules an optimizer was given."""

from __future__ import annotations

from torchplace.lint import lint_source

SUBMODULE_GROUPS = """\
import torch
import torch.nn as nn


def main(opts, model, device):
    optimizer = torch.optim.SGD(params=[
        {"params": model.backbone.parameters(), "lr": 0.1 * opts.lr},
        {"params": model.classifier.parameters(), "lr": opts.lr},
    ], lr=opts.lr)
    if opts.ckpt is not None:
        model = nn.DataParallel(model)
        model.to(device)
    return optimizer


def after(model, device):
    model.to(device)
    return torch.optim.SGD(model.backbone.parameters(), lr=0.1)


def rebuilt(model, device):
    optimizer = torch.optim.SGD(model.backbone.parameters(), lr=0.1)
    model = nn.Linear(4, 4)
    model.to(device)
    return optimizer
"""


def test_moving_the_model_moves_the_submodule_the_optimizer_got() -> None:
    found = lint_source(SUBMODULE_GROUPS, "train.py", select={"TPL801"})
    assert [f.line for f in found] == [6]
    assert "`model.backbone.parameters()` before `model` is moved" in found[0].message


def test_an_optimizer_after_the_move_or_a_rebound_model_is_left_alone() -> None:
    found = lint_source(SUBMODULE_GROUPS, "train.py", select={"TPL801"})
    assert all(f.line < 16 for f in found)


# --- a tuple rebinding, a move in a function defined later, a move after the last use ---

NOTEBOOK_RUNS = """\
import torch
import torchvision

device = "cuda" if torch.cuda.is_available() else "cpu"


def create_model():
    return torchvision.models.resnet18(), None


model, transforms = create_model()
model.to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer)
model, transforms = create_model()
model.to(device)


def predict(model, image):
    model.to(device)
    return model(image.to(device))


deployed = torchvision.models.resnet18()
tuned = torch.optim.Adam(deployed.parameters(), lr=1e-3)
train(deployed, tuned)
deployed.to("cpu")
"""


def test_a_tuple_rebinding_a_defined_function_and_a_move_after_training_are_left_alone() -> None:
    # `model, transforms = create_model()` holds another model; `predict` moves its own
    # parameter when called; `tuned` is never read after `deployed` goes to the CPU
    assert lint_source(NOTEBOOK_RUNS, "nb.py", select={"TPL801"}) == []


GLOBAL_OPTIMIZER = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train(x):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()


model.to(device)
train(torch.randn(2, 4, device=device))
net = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
net.to(device)
opt.step()
"""


def test_an_optimizer_read_after_the_move_or_by_a_function_is_reported() -> None:
    found = lint_source(GLOBAL_OPTIMIZER, "train.py", select={"TPL801"})
    assert [f.line for f in found] == [5, 17]


KEPT_BY_AN_OBJECT = """\
import torch
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = Trainer(model, opt)
model.cuda()
trainer.fit()
"""


def test_an_optimizer_an_object_keeps_is_reported_though_its_name_is_not_read_again() -> None:
    found = lint_source(KEPT_BY_AN_OBJECT, "train.py", select={"TPL801"})
    assert [f.line for f in found] == [3]


REBOUND_IN_ANOTHER_BRANCH = """\
import torch
model = Net()
if checkpoint is None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
else:
    optimizer = checkpoint["optimizer"]
model = model.to(device)
train(model, optimizer)
"""


def test_a_rebinding_in_another_branch_does_not_excuse_the_move() -> None:
    found = lint_source(REBOUND_IN_ANOTHER_BRANCH, "train.py", select={"TPL801"})
    assert [f.line for f in found] == [4]
