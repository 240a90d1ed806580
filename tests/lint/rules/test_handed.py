"""Provenance (provenance/given.py): a parameter every caller of a function binds to a device
value holds one inside it, wherever those calls run; TPL201 then sees the batch loop of a
``validate(model, loader)`` called once per epoch with the model its caller moved. Also: an
instance a caller's function builds and returns (``model = load_model()``), and a parameter a
training-step method rebinds from its own host copy (``lengths = lengths.cpu().numpy()``)."""

from __future__ import annotations

from torchplace.lint import lint_source

HANDED = """\
import torch
from torch import nn


def load_model():
    return nn.Linear(4, 2).cuda()


def validate(model, loader):
    total = 0.0
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        total += loss.item()
    return total


def main(train_loader, val_loader, epochs):
    model = load_model()
    for epoch in range(epochs):
        print(validate(model, val_loader))
"""

# the same function, also called with a model left on the CPU: the callers disagree
CPU_CALLER = (
    HANDED
    + """

def check(loader):
    return validate(nn.Linear(4, 2), loader)
"""
)

# a parameter the callers hand a device value, walked item by item: a tensor's rows or a list
# of per-image outputs, the callers do not say which (nor how often they call)
WALKED = """\
import torch


def output_to_target(output):
    targets = []
    for i, o in enumerate(output):
        targets.append(o[:10, :6].cpu())
    return targets


def evaluate(model, loader, device, plots):
    model.to(device)
    for batch_i, (im, targets) in enumerate(loader):
        preds = model(im.to(device))
        if plots and batch_i < 3:
            output_to_target(preds)
"""


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_source(source, "train.py", select={"TPL201"})]


def test_a_loop_running_the_model_every_caller_moved_is_a_batch_loop() -> None:
    assert _lines(HANDED) == [13]


def test_a_caller_that_hands_a_cpu_model_leaves_it_unknown() -> None:
    assert _lines(CPU_CALLER) == []


def test_walking_a_handed_value_is_not_a_walk_over_rows() -> None:
    assert _lines(WALKED) == []


# an optimizer built over the moved model's parameters: its groups hold hyperparameters
HYPERPARAMETERS = """\
import torch


def train_one_epoch(model, loader, optimizer, device):
    for x, y in loader:
        loss = model(x.to(device)).sum()
        loss.backward()
        for group in optimizer.param_groups:
            if group["weight_decay"] > 0:
                group["weight_decay"] = 0.05
        optimizer.step()


def main(loader, device):
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    train_one_epoch(model, loader, optimizer, device)
"""


def test_an_optimizers_param_groups_are_host_hyperparameters() -> None:
    assert _lines(HYPERPARAMETERS) == []


# ---- a model another function builds, and a parameter its method rebinds from its own copy

# `model = load_model()` is a `Net` (load_model returns one it builds), so the loop that
# trains it makes `Net.forward` and the submodule's `forward` part of a training step; the
# encoder reads the device lengths it is handed before rebinding them to the host copy
REBOUND = """\
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x, lengths):
        lengths = lengths.cpu().numpy()
        x = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = self.lstm(x)
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x, lengths):
        return self.encoder(x, lengths)


def load_model():
    model = Net().cuda()
    return model


def train(loader):
    model = load_model()
    optimizer = torch.optim.Adam(model.parameters())
    for x, lengths in loader:
        out = model(x.cuda(), lengths.cuda())
        out.data.sum().backward()
        optimizer.step()
"""

# the same rebinding outside a training step: a helper copies the detections it is handed to
# draw them, the result of inference
DRAWN = """\
import cv2
import torch


class Painter:
    def visual(self, output, img):
        output = output.cpu()
        for box in output[:, :4].numpy():
            cv2.rectangle(img, box[:2], box[2:], (0, 255, 0))
        return img


def demo(model, images, device):
    model.to(device)
    painter = Painter()
    for img in images:
        with torch.no_grad():
            outputs = model(torch.from_numpy(img).to(device))
        cv2.imwrite("out.jpg", painter.visual(outputs, img))
"""


def test_a_parameter_rebound_to_its_own_host_copy_is_read_as_handed() -> None:
    assert _lines(REBOUND) == [11]


def test_an_inference_helper_copying_what_it_draws_stays_clean() -> None:
    assert _lines(DRAWN) == []
