"""Round 51: a script that never names a device and whose ``if __name__ == "__main__":`` block
is the program itself (it parses a command line or trains the model: the PyTorch examples'
``time_sequence_prediction/train.py``) runs its modules on the CPU, like one that builds them
in its top-level code (TPL103). A block that only builds the module and runs it once is a
library's quick check, and the module is still checked."""

from __future__ import annotations

from .helpers import lines

SCRIPT = """\
import argparse
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input):
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            outputs += [self.linear(h_t)]
        return torch.cat(outputs, dim=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    opt = parser.parse_args()
    data = torch.load("traindata.pt")
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
    for i in range(opt.steps):
        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(data[:, :-1]), data[:, 1:])
            loss.backward()
            return loss
        optimizer.step(closure)
"""

QUICK_CHECK = """\
import torch
import torch.nn as nn


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)

    def forward(self, input):
        h_t = torch.zeros(input.size(0), 51)
        c_t = torch.zeros(input.size(0), 51)
        return self.lstm1(input, (h_t, c_t))


if __name__ == "__main__":
    seq = Sequence()
    print(seq(torch.randn(2, 1))[0].shape)
"""


def test_cpu_only_script_with_main_program_is_clean() -> None:
    assert lines(SCRIPT, "TPL103") == []


def test_main_block_that_only_trains_is_clean() -> None:
    trains = SCRIPT.replace("    opt = parser.parse_args()\n", "    opt = None\n").replace(
        "range(opt.steps)", "range(15)"
    )
    assert lines(trains, "TPL103") == []


def test_quick_check_under_main_still_reported() -> None:
    assert lines(QUICK_CHECK, "TPL103", "models/lstm.py") == [11, 12]


def test_script_that_names_a_device_still_reported() -> None:
    placed = SCRIPT.replace("    seq.double()\n", "    seq.double().to('cuda')\n")
    assert lines(placed, "TPL103") == [15, 16]
