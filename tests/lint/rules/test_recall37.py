"""Recall round 37: device-contract bugs that real projects fixed, tried on the code before the
fix (and the fixed code, which must be clean), each fix here next to the look-alike that must
stay clean.

Found already: ``.item()`` of the losses on every step of a GAN's loop (TPL201, the fix reads
them every tenth step); ``torch.load`` without ``map_location`` in model loaders, also one
where the project's own CPU fallback made it fail (TPL401, the fix passes ``map_location``,
also positionally); ``time.time()`` around a depth network's inference without a synchronize
(TPL301); a module's recurrent states kept as plain attributes (TPL501, the fix registers
buffers); ``torch.zeros(...).cuda()`` joined with a layer's weight in a ``forward``, and bare
``.cuda()`` in a language model's text generation that broke on ``cuda:1`` (TPL102);
``torch.load`` of a checkpoint whose optimizer state then needs moving (TPL401 at the load).

Fixed now:

- a tensor factory combined with a name the function binds to tensor ops of a tensor
  parameter (``max_preds = preds.argmax(1, keepdim=True)``, ``correct = max_preds[i].eq(y[i])``,
  then ``correct.sum() / torch.FloatTensor([n])``), and ``keepdim=`` (torch's spelling; numpy's
  is ``keepdims=``) or a tensor-only use of such a name as evidence that the parameter is a
  tensor (TPL103);
- in a method of an ``nn.Module``, a factory indexed by a mask of the module's own parameters
  (``torch.linspace(0, 1, n)[self.get_opacities() > 0.5]``, a method returning
  ``torch.sigmoid(self.alpha_logit)``): a host tensor indexed by a device mask fails, and a
  later move of a host copy of the result (``.numpy()``, then ``torch.from_numpy(...).to(d)``)
  does not excuse it (TPL103);
- an optimizer class handed in as a parameter that defaults to one of ``torch.optim``
  (``optimizer_fn=torch.optim.Adam``, then ``optimizer_fn(self.model.parameters())`` in
  ``__init__`` while ``fit`` moves the model), or bound by branches to optimizer classes
  (``optimizer_cls = bnb.optim.AdamW8bit`` or ``torch.optim.AdamW``, the UNet moved after the
  optimizer is built) (TPL801);
- a checkpoint path looked up by key in a configuration mapping
  (``torch.load(config["model_params"]["APC"]["ckp_path"])``) is named by its key, not by the
  mapping: a checkpoint, not host-only configuration state; and ``if opt.device == "cuda":
  model.cuda()`` beside the load chooses CUDA or not, so the load is no CUDA-only branch
  (TPL401);
- a request handler that loads a model only while its cache entry is empty
  (``if model_dict[name] is None: model_dict[name] = torch.hub.load(...)``) loads it once, on
  the first request for it, and is left alone (TPL403, the fix the project made);
- a console line in a branch that restarts the clock it tests (``if t[-1] - last_display >
  1.0: last_display = t[-1]``) runs once a second, not on every step: its reads are left
  alone, while the log file written on every step is still reported (TPL201, a point-cloud
  trainer whose per-step synchronize was the complaint: that synchronize serves its timing).

Out of scope: a Python 2 file (a syntax error); a ``map_location`` fix in commented-out code;
a factory combined with ``x.min()`` of a parameter nothing shows to be a tensor (a NumPy array
works the same); timing through a callable handed in, whose synchronize only ran for MPS; a
bare ``.cuda()`` beside ``.to(cuda)`` where ``cuda`` is ``torch.device("cuda:0")`` (the same
GPU); an optimizer built by a configuration object's ``init_obj`` in one file while the
trainer's constructor in another moves the model; a move to the device after the optimizer
that a project made on purpose (to build the optimizer before the model fills GPU memory).
"""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL103: a factory combined with a name derived from a tensor parameter

ACCURACY = """\
import torch


def categorical_accuracy(preds, y, tag_pad_idx):
    max_preds = preds.argmax(dim=1, keepdim=True)
    non_pad_elements = (y != tag_pad_idx).nonzero()
    correct = max_preds[non_pad_elements].squeeze(1).eq(y[non_pad_elements])
    return correct.sum() / torch.FloatTensor([y[non_pad_elements].shape[0]])
"""


def test_a_factory_combined_with_a_name_derived_from_a_tensor_parameter_is_reported() -> None:
    assert _lines(ACCURACY, "TPL103") == [8]


def test_the_factory_placed_on_the_device_is_left_alone() -> None:
    fixed = ACCURACY.replace(".shape[0]])", ".shape[0]]).to(preds.device)")
    assert _lines(fixed, "TPL103") == []


def test_a_parameter_nothing_shows_to_be_a_tensor_is_left_alone() -> None:
    # `keepdims=` is numpy's spelling: preds may be an array, and the division works on it
    numpy_like = ACCURACY.replace("keepdim=True", "keepdims=True").replace(
        ".squeeze(1).eq(y[non_pad_elements])", " == y[non_pad_elements]"
    )
    assert _lines(numpy_like, "TPL103") == []


def test_a_name_rebound_to_a_host_value_is_not_derived() -> None:
    source = """\
import torch


def accuracy(preds, y):
    correct = preds.argmax(1, keepdim=True).eq(y)
    correct = correct.sum().item()
    return correct / torch.FloatTensor([y.shape[0]])
"""
    assert _lines(source, "TPL103") == []


# ---- TPL103: a factory indexed by a mask of the module's own parameters

BLOCKS = """\
import torch
from torch import nn


class Blocks(nn.Module):
    def __init__(self, n):
        super().__init__()
        self._init_blocks(n)

    def _init_blocks(self, n):
        self.alpha_logit = nn.Parameter(torch.zeros(n))
        self.n_blocks = n

    def get_opacities(self):
        alpha = torch.sigmoid(self.alpha_logit)
        alpha = alpha * (alpha > 0.01)
        return alpha

    def forward(self, x):
        return x * self.get_opacities()[:, None]

    @torch.no_grad()
    def face_colors(self, cmap, device):
        val_blocks = torch.linspace(0, 1, self.n_blocks + 1)[1:]
        val_blocks = val_blocks[self.get_opacities() > 0.5]
        colors = cmap(val_blocks.numpy())
        return torch.from_numpy(colors).float().to(device)
"""


def test_a_factory_indexed_by_a_mask_of_the_modules_parameters_is_reported() -> None:
    assert _lines(BLOCKS, "TPL103") == [24]


def test_the_mask_brought_to_the_host_first_is_left_alone() -> None:
    fixed = BLOCKS.replace("self.get_opacities() > 0.5", "self.get_opacities().cpu() > 0.5")
    assert _lines(fixed, "TPL103") == []


def test_a_method_that_does_not_return_only_parameter_values_is_left_alone() -> None:
    # the method may hand back a host value: its result is not known to be on the device
    mixed = BLOCKS.replace(
        "        return alpha\n",
        "        if self.n_blocks == 0:\n            return 1.0\n        return alpha\n",
    )
    assert _lines(mixed, "TPL103") == []


def test_a_parameter_read_directly_as_a_mask_is_reported_in_any_method() -> None:
    source = """\
import torch
from torch import nn


class Gates(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("keep", torch.ones(n, dtype=torch.bool))

    def kept_ids(self, n):
        return torch.arange(n)[self.keep]

    def kept_ids_on_host(self, n):
        return torch.arange(n)[self.keep.cpu()]
"""
    assert _lines(source, "TPL103") == [11]


# ---- TPL801: an optimizer class handed in as a parameter defaulting to torch.optim

TRAINER = """\
import torch


class CTRTrainer(object):
    def __init__(self, model, optimizer_fn=torch.optim.Adam, optimizer_params=None, device="cpu"):
        if optimizer_params is None:
            optimizer_params = {"lr": 1e-3}
        self.model = model
        self.optimizer = optimizer_fn(self.model.parameters(), **optimizer_params)
        self.device = torch.device(device)

    def train_one_epoch(self, loader):
        for x, y in loader:
            loss = self.model(x.to(self.device)).sum()
            loss.backward()
            self.optimizer.step()

    def fit(self, loader, epochs):
        self.model.to(self.device)
        for _ in range(epochs):
            self.train_one_epoch(loader)
"""


def test_an_optimizer_class_parameter_defaulting_to_torch_optim_is_followed() -> None:
    assert _lines(TRAINER, "TPL801") == [9]


def test_the_model_moved_before_the_optimizer_is_built_is_left_alone() -> None:
    fixed = TRAINER.replace(
        "        self.model = model\n",
        "        self.model = model\n        self.model.to(torch.device(device))\n",
    ).replace("        self.model.to(self.device)\n", "")
    assert _lines(fixed, "TPL801") == []


def test_a_callable_parameter_without_an_optimizer_default_is_left_alone() -> None:
    # `make` may build anything from the parameters (a gradient clipper, a logger)
    other = TRAINER.replace("optimizer_fn=torch.optim.Adam", "optimizer_fn=None")
    assert _lines(other, "TPL801") == []


SCRIPT = """\
import torch


def main(args, unet, device):
    if args.use_8bit_adam:
        try:
            import bitsandbytes as bnb

            optimizer_cls = bnb.optim.AdamW8bit
        except ImportError:
            optimizer_cls = torch.optim.AdamW
    else:
        optimizer_cls = torch.optim.AdamW

    optimizer = optimizer_cls(unet.parameters(), lr=args.lr)
    unet = unet.to(device, dtype=torch.float32)
    for batch in args.loader:
        unet(batch.to(device)).sum().backward()
        optimizer.step()
"""


def test_an_optimizer_class_chosen_by_branches_is_followed() -> None:
    assert _lines(SCRIPT, "TPL801") == [15]


def test_a_name_that_may_hold_another_callable_is_left_alone() -> None:
    # a project builder may move the model itself before building anything
    other = SCRIPT.replace(
        "        optimizer_cls = torch.optim.AdamW\n\n",
        "        optimizer_cls = build_optimizer\n\n",
    )
    assert _lines(other, "TPL801") == []


# ---- TPL401: a checkpoint path read from a configuration, a device option compared by name

DEMO = """\
import argparse

import torch

from models import APCEncoder

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=str, default="cpu", help="cuda or cpu")
    opt = parser.parse_args()
    config = {"model_params": {"APC": {"ckp_path": "apc.pth"}}}
    apc = APCEncoder()
    apc.load_state_dict(torch.load(config["model_params"]["APC"]["ckp_path"]), strict=False)
    if opt.device == "cuda":
        apc.cuda()
    apc.eval()
"""


def test_a_checkpoint_path_looked_up_in_a_config_is_a_checkpoint() -> None:
    assert _lines(DEMO, "TPL401") == [13]


def test_a_load_with_map_location_is_left_alone() -> None:
    fixed = DEMO.replace('["ckp_path"])', '["ckp_path"], map_location=opt.device)')
    assert _lines(fixed, "TPL401") == []


def test_a_configuration_file_is_still_host_state() -> None:
    config = DEMO.replace('["APC"]["ckp_path"]', '["APC"]["config_file"]')
    assert _lines(config, "TPL401") == []


def test_a_load_beside_unconditional_cuda_calls_is_a_cuda_only_branch() -> None:
    # no test of the device: the branch runs on CUDA only, where the checkpoint was saved
    pinned = DEMO.replace('    if opt.device == "cuda":\n        apc.cuda()\n', "    apc.cuda()\n")
    assert _lines(pinned, "TPL401") == []


# ---- TPL403: a handler that loads a model only the first time it is asked for

SERVER = """\
import torch
from fastapi import FastAPI

app = FastAPI()
model_dict = {name: None for name in ["yolov5s", "yolov5m"]}


@app.post("/detect")
async def detect_via_api(model_name: str, images: list):
    if model_dict[model_name] is None:
        model_dict[model_name] = torch.hub.load("ultralytics/yolov5", model_name)
    return model_dict[model_name](images)
"""


def test_a_lazy_load_in_a_request_handler_is_left_alone() -> None:
    assert _lines(SERVER, "TPL403") == []


def test_a_load_on_every_request_is_reported() -> None:
    every = SERVER.replace("    if model_dict[model_name] is None:\n    ", "")
    assert _lines(every, "TPL403") == [10]


# ---- TPL201: a console line printed once per interval of time

THROTTLED = """\
import time

import torch


def train(net, loader, optimizer, device):
    last_display = time.time()
    for batch in loader:
        outputs = net(batch.to(device))
        loss = outputs.mean()
        loss.backward()
        optimizer.step()
        now = time.time()
        if now - last_display > 1.0:
            last_display = now
            print("loss", loss.item())
"""


def test_a_read_in_a_branch_that_restarts_its_clock_is_left_alone() -> None:
    assert _lines(THROTTLED, "TPL201") == []


def test_a_time_test_whose_mark_is_never_restarted_is_every_step() -> None:
    # without the restart the test holds on every step after the first second
    every = THROTTLED.replace("            last_display = now\n", "")
    assert _lines(every, "TPL201") == [15]
