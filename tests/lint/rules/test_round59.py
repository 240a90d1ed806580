"""Rule behaviour found on code the corpus did not hold yet: Lightning's per-batch hooks
(`on_train_batch_end`) and the submodules they call, whose buffers moved with the module,
importers in namespace packages below a sibling folder, a test behind a flag its branch
latches, host values packed and moved for a collective, the heads a model returns as a tuple
(TPL201); `torch.cuda.amp` read as a use of CUDA, not a choice (TPL401); a tensor attribute
registered on one branch only (TPL501)."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: Lightning's batch hooks, and a submodule the module moved with it

EMA = """\
import torch
from torch import nn


class Ema(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.register_buffer("num_updates", torch.tensor(0, dtype=torch.int))
        self.register_buffer("decay", torch.tensor(0.999))

    def forward(self, model):
        if self.num_updates >= 0:
            self.num_updates += 1
        print(self.decay.item())
"""

LIGHTNING = """\
import pytorch_lightning as pl
from torch import nn

from pkg.modules.ema import Ema


class Diffusion(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(4, 4)
        self.model_ema = Ema(self.model)

    def training_step(self, batch, batch_idx):
        return self.model(batch).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.model_ema(self.model)
        print(outputs["loss"].item())
"""


def test_a_batch_hook_runs_per_batch_with_the_step_outputs_on_the_device() -> None:
    source = EMA + LIGHTNING.replace("from pkg.modules.ema import Ema\n", "")
    # the hook's own read of the step's outputs, and the submodule it calls: its buffers
    # were moved with the module (the framework moved it), compared and read each batch
    assert _lines(source, "TPL201") == [12, 14, 31]


def test_a_submodule_called_from_another_namespace_package_is_followed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `pkg/modules/ema.py` imported as `pkg.modules.ema` by `pkg/models/diffusion/ddpm.py`:
    # folders without `__init__.py`, the importer two folders below a sibling folder
    files = {"pkg/modules/ema.py": EMA, "pkg/models/diffusion/ddpm.py": LIGHTNING}
    found = _project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert found == [
        ("pkg/models/diffusion/ddpm.py", 18),
        ("pkg/modules/ema.py", 12),
        ("pkg/modules/ema.py", 14),
    ]


def test_a_hook_of_a_callback_or_a_submodule_of_an_unmoved_owner_is_left_alone() -> None:
    # a callback's hook: `self` is the callback, whose attributes no framework moves
    callback = EMA + (
        "import pytorch_lightning as pl\n\n\n"
        "class Track(pl.Callback):\n"
        "    def __init__(self):\n"
        "        self.ema = Ema(None)\n\n"
        "    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):\n"
        "        self.ema(pl_module)\n"
    )
    assert _lines(callback, "TPL201") == []
    # a helper object's method, not a hook: not per batch by its name
    plain = EMA + LIGHTNING.replace("from pkg.modules.ema import Ema\n", "").replace(
        "on_train_batch_end", "on_fit_end"
    )
    assert _lines(plain, "TPL201") == []


# ---- TPL401: `torch.cuda.amp` in a line that tests something is no choice of CUDA

CUDA_ONLY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--benchmark", action="store_true")
args = parser.parse_args()

network = torch.nn.Linear(4, 4).cuda().eval()
with torch.cuda.amp.autocast(enabled=not args.benchmark):
    weights = torch.load(args.model, weights_only=True)
    network.load_state_dict(weights)
"""


def test_autocast_in_a_cuda_only_script_is_not_a_cpu_path() -> None:
    assert _lines(CUDA_ONLY, "TPL401") == []
    # a real choice still makes the load one that may run elsewhere
    choice = CUDA_ONLY.replace(
        "network = torch.nn.Linear(4, 4).cuda().eval()",
        "network = torch.nn.Linear(4, 4)\nif torch.cuda.is_available():\n"
        "    network = network.cuda()",
    )
    assert _lines(choice, "TPL401") == [14]
    counted = CUDA_ONLY.replace(
        "with torch.cuda.amp", "if torch.cuda.device_count() > 1:\n    pass\nwith torch.cuda.amp"
    )
    assert _lines(counted, "TPL401") == [14]


# ---- TPL501: a tensor attribute registered on one branch only

LOGVAR = """\
import torch
from torch import nn


class Diffusion(nn.Module):
    def __init__(self, steps, learn_logvar=False):
        super().__init__()
        self.logvar = torch.full(fill_value=0.0, size=(steps,))
        if learn_logvar:
            self.logvar = nn.Parameter(self.logvar, requires_grad=True)

    def forward(self, loss, t):
        return loss / torch.exp(self.logvar[t])
"""


def test_a_tensor_registered_on_one_branch_stays_plain_on_the_other() -> None:
    assert _lines(LOGVAR, "TPL501") == [8]
    always = LOGVAR.replace(
        "        if learn_logvar:\n            self.logvar = nn.Parameter(self.logvar, requires_grad=True)",
        "        self.logvar = nn.Parameter(self.logvar, requires_grad=learn_logvar)",
    )
    assert _lines(always, "TPL501") == []


# ---- TPL201: a test behind a flag the branch latches

QUEUE = """\
import torch


def train(loader, model, queue_length):
    queue = torch.zeros(queue_length, 128).cuda() if queue_length else None
    use_the_queue = False
    for inputs in loader:
        out = model(inputs.cuda())
        if queue is not None:
            if use_the_queue or not torch.all(queue[-1, :] == 0):
                use_the_queue = True
                out = torch.cat((queue, out))
        out.sum().backward()
"""


def test_a_test_behind_a_flag_the_branch_latches_runs_until_it_is_set() -> None:
    assert _lines(QUEUE, "TPL201") == []
    # unset again on every step, or with `and`: the test reads the device each step
    reset = QUEUE.replace(
        "        out = model(inputs.cuda())\n",
        "        out = model(inputs.cuda())\n        use_the_queue = False\n",
    )
    assert _lines(reset, "TPL201") == [11]
    joined = QUEUE.replace("if use_the_queue or not", "if use_the_queue and not")
    assert _lines(joined, "TPL201") == [10]


# ---- TPL201: a host average packed, moved and reduced once per metric

REDUCED = """\
import torch
import torch.distributed as dist


def finalize(values, counts, world_size, log):
    for k, v in values.items():
        avg = v / counts[k]
        avg = torch.tensor(avg).cuda()
        dist.reduce(avg, dst=0)
        avg = (avg / world_size).cpu().item()
        log(k, avg)
"""


def test_a_host_value_packed_and_moved_for_a_collective_is_no_batch() -> None:
    assert _lines(REDUCED, "TPL201") == []
    # moved and computed on, not reduced: the loop works on the device each step
    computed = REDUCED.replace("        dist.reduce(avg, dst=0)\n", "        avg = avg.exp()\n")
    assert _lines(computed, "TPL201") == [10]


# ---- TPL201: the heads a model's forward returns as a tuple, walked one by one

HEADS = """\
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1)

    def forward(self, x):
        return self.a(x), self.b(x)


class Detector:
    def __init__(self):
        self.net = Body().cuda().eval()

    def heatmap(self, images):
        with torch.no_grad():
            outputs = self.net(torch.from_numpy(images).cuda())
        mask = np.zeros(images.shape[-2:])
        for sub_output in outputs:
            sub_output = sub_output.cpu().numpy()
            mask = np.maximum(mask, np.max(sub_output[0], 0))
        plt.imshow(mask)
        plt.savefig("heatmap.png")
"""


def test_the_heads_a_forward_returns_as_a_tuple_are_whole_tensors_not_rows() -> None:
    assert _lines(HEADS, "TPL201") == []
    # a forward returning one tensor: iterating its output walks the batch's rows
    # also when the attribute is rebound to a wrapper of the model after it is built
    wrapped = HEADS.replace(
        "        self.net = Body().cuda().eval()\n",
        "        self.net = Body().cuda().eval()\n        self.net = torch.nn.DataParallel(self.net)\n",
    )
    assert "DataParallel" in wrapped
    assert _lines(wrapped, "TPL201") == []
    one = HEADS.replace("return self.a(x), self.b(x)", "return self.a(x) + self.b(x)")
    assert _lines(one, "TPL201") == [25]


# ---- TPL501: a plain tensor attribute computed on, then the result placed

PRIOR = """\
import torch
from torch import nn
from torch.distributions import Gamma


class Prior(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.alpha = torch.tensor([shape])

    def sample(self, n, device):
        z = Gamma(self.alpha, self.alpha).sample((n,))
        z = z.squeeze().to(device)
        return z
"""


def test_an_attribute_computed_on_before_the_result_is_placed_stays_plain() -> None:
    # the sampling runs where the attribute lives (the host), whatever the result's move
    assert _lines(PRIOR, "TPL501") == [9]
    # a view of the attribute, placed at its next use, is a placed copy (Point-BERT's seed)
    view = PRIOR.replace(
        "Gamma(self.alpha, self.alpha).sample((n,))", "self.alpha.unsqueeze(0).expand(n, -1)"
    )
    assert _lines(view, "TPL501") == []


# ---- TPL402: the hub's downloads unpickle with weights_only=False by default

HUB = """\
import torch

try:
    from torchvision.models.utils import load_state_dict_from_url
except ImportError:
    from torch.utils.model_zoo import load_url as load_state_dict_from_url


def resnet50(url):
    return torch.hub.load_state_dict_from_url(url, map_location="cpu")


def inception(url):
    return load_state_dict_from_url(url, progress=True)
"""


def test_a_hub_download_without_weights_only_is_reported_and_fixed() -> None:
    assert _lines(HUB, "TPL402") == [10, 14]
    fixed = HUB.replace('map_location="cpu")', 'map_location="cpu", weights_only=True)').replace(
        "progress=True)", "progress=True, weights_only=True)"
    )
    assert _lines(fixed, "TPL402") == []
    chosen = HUB.replace('map_location="cpu")', 'map_location="cpu", weights_only=False)')
    assert _lines(chosen, "TPL402") == [14]
    # a function of the project's own with the same name is no download of torch's
    own = "def load_state_dict_from_url(url):\n    return {}\n\n\nload_state_dict_from_url('x')\n"
    assert _lines(own, "TPL402") == []


# ---- TPL201: a fill value read as a Python number; a schedule moved by the class's setter

SAMPLER = """\
import torch


class Sampler:
    def __init__(self, model):
        self.model = model

    def register_buffer(self, name, attr):
        if type(attr) == torch.Tensor:
            if attr.device != torch.device("cuda"):
                attr = attr.to(torch.device("cuda"))
        setattr(self, name, attr)

    def make_schedule(self, steps):
        self.register_buffer("alphas", torch.linspace(0.9, 0.1, steps))

    def sample(self, shape, steps, device):
        self.make_schedule(steps)
        x = torch.randn(shape, device=device)
        for index in reversed(range(steps)):
            t = torch.full((shape[0],), index, device=device, dtype=torch.long)
            x = self.step(x, t, index)
        return x

    def step(self, x, t, index):
        a_t = torch.full((x.shape[0], 1), self.alphas[index], device=x.device)
        return self.model(x, t) * a_t
"""


def test_an_element_as_a_fill_value_of_a_schedule_moved_by_a_setter_is_read() -> None:
    assert _lines(SAMPLER, "TPL201") == [26]
    # a setter that keeps what it is given: the schedule stays on the host
    keeps = SAMPLER.replace(
        '            if attr.device != torch.device("cuda"):\n'
        '                attr = attr.to(torch.device("cuda"))\n',
        "            attr = attr.float()\n",
    )
    assert _lines(keeps, "TPL201") == []
    # a fill value that is a Python number already
    number = SAMPLER.replace("self.alphas[index]", "float(index)")
    assert _lines(number, "TPL201") == []


# ---- TPL102: `isinstance(x, torch.cuda.FloatTensor)` is the tensor's own CUDA test

PADS = """\
import torch
import torch.nn.functional as F
from torch import nn


class ResNet(nn.Module):
    def _downsample(self, x, planes, stride):
        out = F.avg_pool3d(x, kernel_size=1, stride=stride)
        zero_pads = torch.zeros(out.size(0), planes - out.size(1), *out.shape[2:])
        if isinstance(out.data, torch.cuda.FloatTensor):
            zero_pads = zero_pads.cuda()
        return torch.cat([out.data, zero_pads], dim=1)
"""


def test_a_move_under_an_isinstance_test_of_a_cuda_tensor_type_follows_the_input() -> None:
    assert _lines(PADS, "TPL102") == []
    # a test of something else chooses the device for the module
    other = PADS.replace("isinstance(out.data, torch.cuda.FloatTensor)", "self.use_gpu")
    assert _lines(other, "TPL102") == [11]


# ---- TPL501: a list display repeated with `*`, and a cache placed wherever it is read

GRID = """\
import torch
from torch import nn


class Detect(nn.Module):
    def __init__(self, nl):
        super().__init__()
        self.nl = nl
        self.grid = [torch.zeros(1)] * nl

    def forward(self, x):
        for i in range(self.nl):
            ny, nx = x[i].shape[2:4]
            if self.grid[i].shape[2:4] != x[i].shape[2:4]:
                self.grid[i] = self._make_grid(nx, ny)
            x[i] = x[i] + self.grid[i]
        return x

    @staticmethod
    def _make_grid(nx, ny):
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        return torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
"""


def test_a_repeated_list_of_tensors_is_a_plain_container_unless_placed_where_read() -> None:
    assert _lines(GRID, "TPL501") == [9]
    placed = GRID.replace("x[i] + self.grid[i]", "x[i] + self.grid[i].to(x[i].device)")
    assert _lines(placed, "TPL501") == []


# ---- TPL501: a result computed from the attribute, then moved, is no placed read

COORDS = """\
import torch
from torch import nn


class AddCoords(nn.Module):
    def __init__(self, height, width):
        super().__init__()
        self.y_coords = torch.arange(height).float().view(1, 1, height, 1).expand(1, 1, -1, width)

    def forward(self, boundary):
        zero = torch.zeros_like(boundary)
        masked = torch.where(boundary > 0.05, self.y_coords, zero).to(zero.device)
        return torch.cat([boundary, masked], dim=1)
"""


def test_a_result_computed_from_an_attribute_then_moved_is_not_a_placed_read() -> None:
    assert _lines(COORDS, "TPL501") == [8]
    placed = COORDS.replace("self.y_coords, zero)", "self.y_coords.to(zero.device), zero)")
    assert _lines(placed, "TPL501") == []


# ---- TPL801: optimizers built from the modules a dict holds, before the owner moves

SOLVER = """\
import torch
from torch import nn


class Solver(nn.Module):
    def __init__(self, nets, device):
        super().__init__()
        self.nets = nn.ModuleDict(nets)
        self.optims = {}
        for net in self.nets.keys():
            self.optims[net] = torch.optim.Adam(params=self.nets[net].parameters(), lr=1e-4)
        self.to(device)
"""


def test_an_optimizer_over_a_held_module_before_the_owner_moves_is_reported() -> None:
    assert _lines(SOLVER, "TPL801") == [11]
    # moved first, then the optimizers: they see the parameters where they will live
    moved_first = SOLVER.replace("        self.to(device)\n", "").replace(
        "        self.optims = {}\n", "        self.to(device)\n        self.optims = {}\n"
    )
    assert "self.to(device)\n        self.optims" in moved_first
    assert _lines(moved_first, "TPL801") == []


# ---- TPL201: an evaluation's bulk copies that update a NumPy metric in the same step

EVALUATOR = """\
import numpy as np
import torch


class Evaluator:
    def __init__(self, num_class):
        self.confusion_matrix = np.zeros((num_class, num_class))

    def add_batch(self, gt, pred):
        mask = (gt >= 0) & (gt < len(self.confusion_matrix))
        np.add.at(self.confusion_matrix, (gt[mask], pred[mask]), 1)


def validate(model, loader, device):
    evaluator = Evaluator(21)
    model.eval()
    for image, target in loader:
        with torch.no_grad():
            output = model(image.to(device))
        pred = output.cpu().numpy()
        pred = np.argmax(pred, axis=1)
        evaluator.add_batch(target.numpy(), pred)
    return evaluator.confusion_matrix
"""


def test_a_bulk_copy_that_updates_a_numpy_metric_each_step_is_left_alone() -> None:
    assert _lines(EVALUATOR, "TPL201") == []
    # a metric that keeps tensors: the copy is not what it needs
    kept = EVALUATOR.replace("np.zeros((num_class, num_class))", "[]").replace(
        "        np.add.at(self.confusion_matrix, (gt[mask], pred[mask]), 1)\n",
        "        self.confusion_matrix.append(pred)\n",
    )
    assert _lines(kept, "TPL201") == [20]
    # copies collected for after the loop are still a read per batch
    collected = EVALUATOR.replace(
        "        evaluator.add_batch(target.numpy(), pred)\n", "        preds.append(pred)\n"
    ).replace("    model.eval()\n", "    model.eval()\n    preds = []\n")
    assert _lines(collected, "TPL201") == [21]


# ---- TPL201: a grown list of device scalars wrapped in a display for a legacy constructor

CONTENT = """\
import torch
import torch.nn.functional as F
from torch import nn


class ContentLoss(nn.Module):
    def __init__(self, extractor, weights):
        super().__init__()
        self.extractor, self.weights = extractor, weights

    def forward(self, sr, gt):
        losses = []
        for scale in self.weights:
            losses.append(F.mse_loss(sr * scale, gt * scale))
        losses = torch.Tensor([losses]).to(sr.device)
        return losses


def train(loader, model, criterion: ContentLoss, optimizer, device):
    for lr, gt in loader:
        sr = model(lr.to(device))
        loss = criterion(sr, gt.to(device)).sum()
        loss.backward()
        optimizer.step()


def main(loader, model, optimizer, extractor, device):
    criterion = ContentLoss(extractor, [1.0])
    train(loader, model.to(device), criterion, optimizer, device)
"""


def test_a_grown_list_of_device_scalars_in_a_legacy_constructor_is_read_per_element() -> None:
    assert _lines(CONTENT, "TPL201") == [15]
    # the display holding host numbers is no read
    floats = CONTENT.replace(
        "losses.append(F.mse_loss(sr * scale, gt * scale))", "losses.append(float(scale))"
    )
    assert _lines(floats, "TPL201") == []


# ---- TPL401: the CUDA side of a branch whose `else` loads mapped to the CPU

FLAG_BRANCH = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", default=True, type=bool)
parser.add_argument("--trained_model")
args = parser.parse_args()

if __name__ == "__main__":
    net = torch.nn.Linear(2, 2)
    if args.cuda:
        net.load_state_dict(torch.load(args.trained_model, weights_only=True))
    else:
        net.load_state_dict(torch.load(args.trained_model, map_location="cpu", weights_only=True))
    if args.cuda:
        net = net.cuda()
"""


def test_a_load_whose_else_maps_to_the_cpu_is_the_cuda_side_of_a_choice() -> None:
    assert _lines(FLAG_BRANCH, "TPL401") == []
    # an `else` that loads without mapping says nothing of the test
    unmapped = FLAG_BRANCH.replace('map_location="cpu", ', "")
    assert _lines(unmapped, "TPL401") == [13, 15]


def test_a_fill_value_given_by_keyword_is_read_as_well() -> None:
    keyword = SAMPLER.replace("self.alphas[index], device", "fill_value=self.alphas[index], device")
    assert _lines(keyword, "TPL201") == [26]
