"""Recall round 38: device-contract bugs that real projects fixed, found through issues and pull
requests titled with their symptoms (low GPU utilization, slow training, memory spikes when a
checkpoint loads, work on ``cuda:0`` from every rank, CPU-only machines that cannot run the
code), tried on the code before the fix (and the fixed code, which must be clean).

Found already: recurrent states kept as plain attributes built on ``x_example.device`` (TPL501,
the fix makes them ``nn.Buffer``s; also a loss module's ``bins`` built in ``__init__``);
``torch.load`` without ``map_location`` in a model loader, an image model's checkpoint loader,
a text-to-speech model's ``from_local`` (TPL401, the fixes pass ``map_location="cpu"``); losses
read with ``.item()`` on every step of a style-GAN's loop (TPL201, the fix reads them every
tenth step) and with ``float(loss)`` in an MLP trainer (TPL201, the fix sums on the device);
the model moved after its optimizer is built in a diffusion trainer (TPL801); ``.cuda()`` in a
time-series attention layer and in a ConvLSTM cell's ``init_hidden`` (TPL102); hidden states
built with ``torch.zeros(X.shape[0], n)`` in the cells of a graph time-series library and a
``torch.randperm`` indexing device data in a protein model's ``forward`` (TPL103);
``torch.zeros(fan_in[0].shape)`` in a NAS cell's ``forward`` (TPL103).

Fixed now:

- a model file whose code follows its tensors' devices (``device = x.device``,
  ``torch.zeros(b, t, device=device)``) with one stray ``torch.zeros(...).cuda()`` in its
  ``generate`` (the TPL102 slip a voice-cloning project fixed) was read as a script pinned to
  CUDA, so the ``torch.load(str(path))`` of its ``load`` method went unreported; the same fix
  passed ``map_location=device`` (TPL401). Only a ``.cuda()`` inside an ``nn.Module``'s
  methods is such a slip: one outside the modules (a detector class's
  ``Network(path).cuda()``) still pins the file, and its loads are left alone.

Out of scope: ``map_location=self.device`` changed to ``"cpu"`` to avoid a transient
GPU-memory spike (a load onto the target device is the documented practice); a
``torch.cuda.set_device`` given a configured GPU id instead of the local rank; a Python 2 file
(a syntax error); a project's own ``to_device`` renamed ``set_device`` and the DDP wrap moved;
an optimizer built by a configuration object's ``init_obj`` while the trainer's constructor in
another file moves the model (round 37's case); a batch fed to a moved model without a move
(no rule reports a move left out); ``torch.full(...)`` parameters built in one function and
combined, two calls away, with data another module loads on the device; a 0-dim accumulator
``torch.tensor(0.0)`` that ``+=`` adds a model's loss into (an in-place target, unlike an
operand, must share the device, but the loss comes from a callable the linter does not follow);
``load_from_checkpoint`` without ``map_location`` (Lightning maps to the CPU itself when CUDA
is absent since 2.1; only the multi-rank case is left).
"""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL401: a stray `.cuda()` in code that follows its tensors' devices is no pin

TACOTRON = """\
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self, n_mels, dims):
        super().__init__()
        self.n_mels = n_mels
        self.rnn = nn.GRUCell(n_mels, dims)

    def forward(self, x):
        device = x.device
        hidden = torch.zeros(x.size(0), self.rnn.hidden_size, device=device)
        return self.rnn(x, hidden)


class Tacotron(nn.Module):
    def __init__(self, n_mels, dims):
        super().__init__()
        self.decoder = Decoder(n_mels, dims)

    def forward(self, x):
        return self.decoder(x)

    def generate(self, n):
        query = torch.zeros(1, n).cuda()
        return self.decoder(query)

    def load(self, path, optimizer=None):
        checkpoint = torch.load(str(path))
        self.load_state_dict(checkpoint["model_state"])
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint["optimizer_state"])
"""


def test_a_load_in_code_that_follows_its_tensors_devices_is_reported() -> None:
    assert _lines(TACOTRON, "TPL401", "synthesizer/models/tacotron.py") == [30]


def test_the_stray_cuda_call_is_still_reported_where_it_is() -> None:
    assert _lines(TACOTRON, "TPL102", "synthesizer/models/tacotron.py") == [26]


def test_the_load_given_a_map_location_is_left_alone() -> None:
    fixed = TACOTRON.replace("torch.load(str(path))", "torch.load(str(path), map_location=device)")
    fixed = fixed.replace("def load(self, path, optimizer=None)", "def load(self, path, device)")
    assert _lines(fixed, "TPL401", "synthesizer/models/tacotron.py") == []


def test_a_script_pinned_to_cuda_that_follows_no_tensor_is_left_alone() -> None:
    source = """\
import torch

from net import Net

model = Net().cuda()
model.load_state_dict(torch.load("net.pt"))
x = torch.randn(1, 3).cuda()
print(model(x))
"""
    assert _lines(source, "TPL401", "run.py") == []


def test_a_cuda_call_outside_the_modules_still_pins_the_file() -> None:
    # a detector class that builds the network on CUDA: the file only ever runs there
    source = """\
import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, model_path):
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 1)
        self.load_state_dict(torch.load(model_path))

    def forward(self, x):
        mean = torch.tensor([104.0, 116.7, 122.7], dtype=x.dtype, device=x.device)
        return self.conv(x - mean.view(1, 3, 1, 1))


class Detector:
    def __init__(self, path):
        self.net = Network(path).cuda().eval()

    def __call__(self, image):
        return self.net(torch.from_numpy(image).float().cuda())
"""
    assert _lines(source, "TPL401", "annotator/hed.py") == []


# ---- found already: kept as regressions of what this round tried

XLSTM = """\
import torch
from torch import nn


class SLSTMBlock(nn.Module):
    def __init__(self, x_example):
        super().__init__()
        self.size = x_example.shape[2]
        self.gate = nn.Linear(self.size, self.size)
        self.init_states(x_example)

    def init_states(self, x):
        self.ct_1 = torch.zeros(1, 1, x.shape[2], device=x.device)
        self.nt_1 = torch.zeros(1, 1, x.shape[2], device=x.device)

    def forward(self, x):
        ct = torch.sigmoid(self.gate(x)) * self.ct_1
        self.ct_1 = ct.detach()
        nt = self.nt_1 + 1
        self.nt_1 = nt.detach()
        return ct / nt
"""


def test_states_built_on_an_examples_device_as_plain_attributes_are_reported() -> None:
    assert _lines(XLSTM, "TPL501") == [13, 14]


def test_states_kept_as_buffers_are_left_alone() -> None:
    fixed = XLSTM.replace(
        "        self.init_states(x_example)\n\n"
        "    def init_states(self, x):\n"
        "        self.ct_1 = torch.zeros(1, 1, x.shape[2], device=x.device)\n"
        "        self.nt_1 = torch.zeros(1, 1, x.shape[2], device=x.device)\n",
        "        self.ct_1 = nn.Buffer(torch.zeros(1, 1, self.size))\n"
        "        self.nt_1 = nn.Buffer(torch.zeros(1, 1, self.size))\n",
    )
    assert "init_states" not in fixed
    assert _lines(fixed, "TPL501") == []


HIDDEN = """\
import torch
from torch import nn


class GConvGRU(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.out_channels = out_channels
        self.lin = nn.Linear(in_channels + out_channels, out_channels)

    def _set_hidden_state(self, X, H):
        if H is None:
            H = torch.zeros(X.shape[0], self.out_channels)
        return H

    def forward(self, X, H=None):
        H = self._set_hidden_state(X, H)
        return torch.tanh(self.lin(torch.cat([X, H], dim=1)))
"""


def test_a_hidden_state_built_for_the_input_without_its_device_is_reported() -> None:
    assert _lines(HIDDEN, "TPL103") == [13]


def test_the_hidden_state_moved_to_the_inputs_device_is_left_alone() -> None:
    fixed = HIDDEN.replace(
        "self.out_channels)\n        return", "self.out_channels).to(X.device)\n        return"
    )
    assert _lines(fixed, "TPL103") == []


TRAINER = """\
import torch


def train(model, loader, optimizer, loss_fun, device, epochs):
    model.to(device)
    for epoch in range(epochs):
        epoch_loss_sum = 0.0
        cnt = 0
        for xb, yb in loader:
            pred = model(xb.to(device))
            loss = loss_fun(pred, yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss_sum += float(loss)
            cnt += 1
        print(epoch, epoch_loss_sum / max(cnt, 1))
"""


def test_a_loss_read_as_a_float_on_every_step_is_reported() -> None:
    assert _lines(TRAINER, "TPL201") == [15]


def test_a_loss_summed_on_the_device_and_read_once_per_epoch_is_left_alone() -> None:
    fixed = TRAINER.replace(
        "epoch_loss_sum = 0.0", "epoch_loss_sum = torch.zeros((), device=device)"
    ).replace("epoch_loss_sum += float(loss)", "epoch_loss_sum += loss.detach()")
    fixed = fixed.replace(
        "print(epoch, epoch_loss_sum / max(cnt, 1))",
        "print(epoch, float(epoch_loss_sum) / max(cnt, 1))",
    )
    assert _lines(fixed, "TPL201") == []
