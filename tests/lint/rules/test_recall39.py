"""Recall round 39: device-contract bugs that real projects fixed, found by the kind of pitfall
(mixed devices in loss and metric code, checkpoints and optimizer state, ``.cuda()`` in library
code, timing, ``.numpy()`` of device tensors), tried on the code before the fix (and the fixed
code, which must be clean).

Found already: ``torch.load`` without ``map_location`` in a forecasting library's ``load`` and
in a brain-imaging network loader (TPL401, the fixes pass ``map_location``); factories in the
``forward`` of a forecasting model and its helpers (TPL103); per-batch ``.tolist()`` of the
predictions in a protein trainer's step (TPL201); a ``.cuda()`` in a mixture-of-experts gate's
``forward`` (TPL102, the whole project linted: the gate's base class is in another file).

Fixed now:

- a factory filling a default, ``weights = torch.ones(n) if weights is None else weights``, is
  followed through the name it is bound to, and its values up a chain of arithmetic: ``L *
  weights.view(-1, 1) * self.task_weights`` meets the module's buffer after an operand of
  unknown place (TPL103, a chemistry library's metric ``update``);
- TorchMetrics' ``Metric`` is an ``nn.Module`` (its subclasses' buffers are the module's), and
  so are torch's private bases (``torch.nn.modules.loss._Loss``): a pinball loss's ``forward``
  building ``torch.ones(...)`` is reported (TPL103); a metric's plain tensor attributes are left
  to TPL501's rule for bases that register states themselves;
- ``torch.tensor(self.quantiles)`` is no 0-dim tensor when the function also takes
  ``len(self.quantiles)`` (TPL103, the same pinball loss);
- a factory placed later in the function is still reported when, before that, it is indexed by
  a tensor the function moved to the device earlier (``depth_range[z_idx].to(self.device)``
  with ``z_idx = z.flatten().to(self.device)``: a host tensor indexed by a device index fails)
  (TPL103, a scene-decomposition renderer's projection);
- a subclass without its own ``forward`` implements the hooks the ``forward`` of its base class
  in the file calls (``LossFunction.forward`` running ``self._forward(prediction, target)``):
  those hooks are on the forward path (TPL103, the quoted loss of a neutrino-physics library's
  issue, ``one_hot(torch.tensor([...]), 3)`` against predictions on the GPU; its history in
  the snapshot no longer reaches the code before the fix);
- a ``.cuda()`` in a function of the file that only an ``nn.Module``'s methods call, directly
  or through other such helpers (a reader's ``get_loss`` and its ``_take_mml``, called from
  ``forward``), is the module's own placement (TPL102, an open-domain QA span predictor);
- an optimizer a helper builds from the parameters it is handed (``create_optimizer(name,
  train_params, lr)``), called by a script that hands it ``model.set_train_params(...)`` and
  moves the model afterwards (TPL801, a remote-sensing segmentation trainer whose resumed
  optimizer state stayed on the CPU; its fix moved the state by hand and kept the order, which
  is still reported).

Out of scope: a loss module's buffer never moved (``L * self.task_weights``: a move left out,
no rule reports one); a loss module built with class weights and not moved to the device (the
same); a project's ``load_from_file`` that hands ``map_location`` to Lightning; a checkpoint
mapped to ``"cpu"`` changed to the trainer's device; ``.type(input.type())`` that places a
label on the current CUDA device instead of the input's; a ``.cuda()`` in the ``__init__`` of a
model wrapper that is no ``nn.Module``; ``.cuda()`` calls in a test file; a ``get_device()``
helper of another module choosing by what the machine has, read in ``forward``; a module's
output placed on a ``self.device`` that defaults to the CPU; a shrinkage matrix a caller hands
on the CPU (no factory); float16 embeddings on the CPU (a dtype, not a device); a metric whose
fix enabled code (no device change); a free function of a multi-GPU scheduler with ``.cuda()``
(called from functions, not modules).
"""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL103: a default filled by a factory, followed up a chain of arithmetic

METRIC = """\
import torch
import torchmetrics
from torch import Tensor


class ChemMetric(torchmetrics.Metric):
    def __init__(self, task_weights=1.0):
        super().__init__()
        task_weights = torch.as_tensor(task_weights, dtype=torch.float).view(1, -1)
        self.register_buffer("task_weights", task_weights)
        self.add_state("total_loss", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, preds: Tensor, targets: Tensor, weights: Tensor | None = None) -> None:
        weights = torch.ones(targets.shape[0], dtype=torch.float) if weights is None else weights
        L = self._calc_unreduced_loss(preds, targets, weights)
        L = L * weights.view(-1, 1) * self.task_weights
        self.total_loss += L.sum()
"""


def test_a_default_filled_by_a_factory_that_meets_a_buffer_is_reported() -> None:
    assert _lines(METRIC, "TPL103", "chem/nn/metrics.py") == [14]


def test_the_default_built_on_the_targets_device_is_left_alone() -> None:
    fixed = METRIC.replace("dtype=torch.float)", "dtype=torch.float, device=targets.device)")
    assert _lines(fixed, "TPL103", "chem/nn/metrics.py") == []


def test_a_factory_several_operations_from_a_tensor_parameter_is_reported() -> None:
    source = """\
import torch
from torch import Tensor


def weighted(loss: Tensor, scale: float) -> Tensor:
    w = torch.ones(loss.shape[0])
    return scale * w * 2 + loss
"""
    assert _lines(source, "TPL103", "losses.py") == [6]


def test_a_factory_in_arithmetic_with_numbers_only_is_left_alone() -> None:
    source = """\
import torch
from torch import Tensor


def weighted(loss: Tensor, scale: float) -> Tensor:
    w = torch.ones(loss.shape[0])
    return (scale * w * 2).to(loss.device) + loss
"""
    assert _lines(source, "TPL103", "losses.py") == []


def test_a_metric_keeps_its_plain_tensor_attributes_to_its_own_base() -> None:
    # TorchMetrics' `Metric` registers and moves the states it is given (`add_state`)
    source = """\
import torch
from torchmetrics import Metric


class SCC(Metric):
    def __init__(self, high_pass_filter=None):
        super().__init__()
        if high_pass_filter is None:
            high_pass_filter = torch.tensor([[-1, -1], [-1, 8]])
        self.hp_filter = high_pass_filter

    def update(self, preds, target):
        self.total = self.total + scc(preds, target, self.hp_filter)
"""
    assert _lines(source, "TPL501", "scc.py") == []


# ---- TPL103: torch's private module bases, and a sized attribute's tensor

PINBALL = """\
import torch
from torch.nn.modules.loss import _Loss


class PinballLoss(_Loss):
    def __init__(self, loss_func, quantiles):
        super().__init__()
        self.loss_func = loss_func
        self.quantiles = quantiles

    def forward(self, outputs, target):
        target = target.repeat(1, 1, len(self.quantiles))
        base_losses = self.loss_func(outputs, target)
        positive = torch.tensor(self.quantiles).unsqueeze(0) * base_losses
        multiplier = torch.ones(size=(1, 1, len(self.quantiles)))
        return multiplier * positive
"""


def test_a_loss_on_torchs_private_base_is_a_module() -> None:
    assert _lines(PINBALL, "TPL103", "prophet/custom_loss_metrics.py") == [14, 15]


def test_the_loss_building_on_the_targets_device_is_left_alone() -> None:
    fixed = PINBALL.replace(
        "torch.tensor(self.quantiles)", "torch.tensor(self.quantiles, device=target.device)"
    )
    fixed = fixed.replace("len(self.quantiles)))", "len(self.quantiles)), device=target.device)")
    assert _lines(fixed, "TPL103", "prophet/custom_loss_metrics.py") == []


def test_a_tensor_of_an_attribute_nothing_shows_to_be_a_sequence_is_left_alone() -> None:
    source = """\
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x / (x.norm() + torch.tensor(self.eps))
"""
    assert _lines(source, "TPL103", "scaled.py") == []


# ---- TPL103: a factory indexed by a tensor moved earlier, placed only afterwards

PROJECTION = """\
import torch


class Projection(object):
    def __init__(self, near=5, far=16, frustum_size=(64, 64, 64), device="cpu"):
        self.device = device
        self.near = near
        self.far = far
        self.frustum_size = frustum_size

    def construct_frus_coor(self):
        z = torch.arange(self.frustum_size[2])
        z_frus = z.flatten().to(self.device)
        depth_range = torch.linspace(self.near, self.far, self.frustum_size[2])
        z_cam = depth_range[z_frus].to(self.device)
        return z_cam
"""


def test_a_factory_indexed_by_a_moved_tensor_before_its_move_is_reported() -> None:
    assert _lines(PROJECTION, "TPL103", "models/projection.py") == [14]


def test_the_factory_placed_before_it_is_indexed_is_left_alone() -> None:
    fixed = PROJECTION.replace(
        "self.frustum_size[2])\n        z_cam",
        "self.frustum_size[2]).to(self.device)\n        z_cam",
    )
    assert _lines(fixed, "TPL103", "models/projection.py") == []


def test_an_index_moved_only_after_the_factory_meets_it_is_left_alone() -> None:
    source = """\
import torch


def pick(n, device):
    idx = torch.arange(n)
    table = torch.linspace(0, 1, n)
    picked = table[idx].to(device)
    idx = idx.to(device)
    return picked, idx
"""
    assert _lines(source, "TPL103", "pick.py") == []


# ---- TPL102: `.cuda()` in a helper that only a module's methods call

SPAN = """\
import torch
from torch import nn
from torch.nn import CrossEntropyLoss


class SpanPredictor(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, x, start_positions=None, answer_mask=None):
        logits = self.qa_outputs(x)
        if start_positions is not None:
            return get_loss(start_positions, answer_mask, logits)
        return logits


def get_loss(start_positions, answer_mask, logits):
    answer_mask = answer_mask.type(torch.FloatTensor).cuda()
    loss_fct = CrossEntropyLoss(reduction="none")
    loss_tensor = loss_fct(logits, start_positions) * answer_mask
    return _take_mml(loss_tensor)


def _take_mml(loss_tensor):
    likelihood = torch.sum(torch.exp(-loss_tensor), 1)
    return -torch.sum(torch.log(likelihood + torch.ones(loss_tensor.size(0)).cuda()))
"""


def test_cuda_in_helpers_that_only_a_modules_forward_calls_is_reported() -> None:
    assert _lines(SPAN, "TPL102", "models/span_predictor.py") == [19, 27]


def test_the_helpers_following_the_input_are_left_alone() -> None:
    fixed = SPAN.replace(
        ".type(torch.FloatTensor).cuda()", ".type(torch.FloatTensor).to(logits.device)"
    )
    fixed = fixed.replace(".size(0)).cuda()", ".size(0), device=loss_tensor.device)")
    assert _lines(fixed, "TPL102", "models/span_predictor.py") == []


def test_a_helper_a_script_also_calls_is_left_alone() -> None:
    source = (
        SPAN
        + """

if __name__ == "__main__":
    print(_take_mml(torch.zeros(2, 3)))
"""
    )
    assert _lines(source, "TPL102", "models/span_predictor.py") == [19]


def test_a_helper_a_sibling_module_imports_is_left_alone(tmp_path: Path) -> None:
    files = {
        "models/span_predictor.py": SPAN,
        "models/evaluate.py": "from span_predictor import get_loss\n\nget_loss(a, m, l)\n",
    }
    # `get_loss` may be handed anything from there, and so may `_take_mml`, which it calls
    assert _project(tmp_path / "proj", files, "TPL102") == []


# ---- TPL801: an optimizer a helper builds from the parameters a caller hands it

NETWORK_IO = """\
from torch import optim


def create_optimizer(optm_name, train_params, lr):
    if optm_name == "sgd":
        optm = optim.SGD(train_params, lr=lr, momentum=0.9)
    else:
        optm = optim.Adam(train_params, lr=lr)
    return optm
"""

TRAIN = """\
import torch

from network import network_io
from network.unet import UNet


def train_model(args, device):
    model = UNet(args["classes"])
    train_params = model.set_train_params((args["lr_encoder"], args["lr_decoder"]))
    optm = network_io.create_optimizer(args["optimizer"], train_params, args["lr_encoder"])
    model.load_state_dict(torch.load(args["resume"], map_location="cpu"))
    model.to(device)
    return model, optm
"""


def test_an_optimizer_built_from_handed_parameters_before_the_move_is_reported(
    tmp_path: Path,
) -> None:
    files = {"network/network_io.py": NETWORK_IO, "train.py": TRAIN}
    found = _project(tmp_path / "mrs", files, "TPL801")
    assert found == [("network/network_io.py", 6), ("network/network_io.py", 8)]


def test_the_model_moved_before_the_parameters_are_handed_over_is_left_alone(
    tmp_path: Path,
) -> None:
    train = TRAIN.replace("    model.to(device)\n", "").replace(
        'model = UNet(args["classes"])', 'model = UNet(args["classes"])\n    model.to(device)'
    )
    files = {"network/network_io.py": NETWORK_IO, "train.py": train}
    assert _project(tmp_path / "mrs", files, "TPL801") == []


def test_parameters_of_no_model_are_left_alone(tmp_path: Path) -> None:
    train = TRAIN.replace(
        'train_params = model.set_train_params((args["lr_encoder"], args["lr_decoder"]))',
        "train_params = [torch.zeros(3, requires_grad=True)]",
    )
    files = {"network/network_io.py": NETWORK_IO, "train.py": train}
    assert _project(tmp_path / "mrs", files, "TPL801") == []


# ---- TPL103: a hook the `forward` of a base class of the file calls

LOSSES = """\
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.functional import cross_entropy, one_hot


class LossFunction(nn.Module):
    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        elements = self._forward(prediction, target)
        return torch.mean(elements)


class MultiClassificationCrossEntropyLoss(LossFunction):
    def _forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        pid_transform = {1: 0, 12: 2, 13: 1, 14: 2, 16: 2}
        classes = [pid_transform[np.abs(int(value))] for value in target]
        target_new = one_hot(torch.tensor(classes), 3)
        return cross_entropy(prediction.float(), target_new.float(), reduction="none")

    def describe(self) -> Tensor:
        return torch.tensor([1, 12, 13, 14, 16])
"""


def test_a_hook_the_base_forward_calls_is_on_the_forward_path() -> None:
    assert _lines(LOSSES, "TPL103", "training/loss_functions.py") == [17]


def test_the_hook_placing_the_targets_is_left_alone() -> None:
    fixed = LOSSES.replace(
        "torch.tensor(classes), 3)", "torch.tensor(classes), 3).to(prediction.device)"
    )
    assert _lines(fixed, "TPL103", "training/loss_functions.py") == []
